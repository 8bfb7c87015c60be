-- Back to one key per (domain, algorithm): only the active keys stay.
CREATE TABLE dkim_keys_old (
    domain TEXT NOT NULL,
    selector TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    private_key TEXT NOT NULL,
    public_key TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (domain, selector),
    UNIQUE (domain, algorithm)
);
INSERT INTO dkim_keys_old (domain, selector, algorithm, private_key, public_key, created_at)
    SELECT domain, selector, algorithm, private_key, public_key, created_at FROM dkim_keys
    WHERE state = 'active';
DROP TABLE dkim_keys;
ALTER TABLE dkim_keys_old RENAME TO dkim_keys;
