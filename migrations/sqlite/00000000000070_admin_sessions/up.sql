-- Admin login sessions, so that logging out ends one on the server: a
-- cookie is let in only while its row is here. `id` is the SHA-256 (hex)
-- of the cookie's nonce, never the nonce itself; `token_fp` names the
-- admin token it was made under, and `serve` drops the sessions of any
-- other token when it starts.
CREATE TABLE admin_sessions (
    id TEXT PRIMARY KEY,
    token_fp TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
