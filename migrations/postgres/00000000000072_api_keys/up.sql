-- API keys of `/api/v1` (`mailsplit apikey`). `key_hash` is the SHA-256
-- (hex) of the key; the key itself is printed once and never stored.
-- `scopes` is a comma-separated list of send, subscribers, campaigns, read.
CREATE TABLE api_keys (
    name TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL UNIQUE,
    scopes TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT
);
-- When a subscriber was first written through `/api/v1` (NULL: created by
-- an import or before this migration).
ALTER TABLE recipients ADD COLUMN created_at BIGINT;
