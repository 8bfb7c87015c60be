-- DKIM keys, one per (domain, algorithm): workers sign every message whose
-- From domain has keys (an RSA and an ed25519 key mean two signatures).
-- `private_key` is the PKCS#8 DER, base64: a secret, never printed;
-- `public_key` is the p= value of the DNS TXT record.
CREATE TABLE dkim_keys (
    domain TEXT NOT NULL,
    selector TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    private_key TEXT NOT NULL,
    public_key TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (domain, selector),
    UNIQUE (domain, algorithm)
);

-- Workers look up recipients whose status changed in the last minutes (a
-- one-click unsubscribe, a bounce), so a message already composed for them
-- is skipped instead of sent.
CREATE INDEX recipients_status_at ON recipients (status_at);
