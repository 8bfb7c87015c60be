-- Issue 27: key rotation. A domain may hold several keys of one algorithm
-- (`dkim rotate` adds one), of which at most one is `active` (it signs);
-- the others are `pending` (made, its TXT record being published) or
-- `retired` (replaced by `dkim activate`; kept so mail signed with it
-- still verifies while its record stays, and to switch back). SQLite
-- cannot drop the old UNIQUE (domain, algorithm), so the table is rebuilt.
CREATE TABLE dkim_keys_rotation (
    domain TEXT NOT NULL,
    selector TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    private_key TEXT NOT NULL,
    public_key TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    state TEXT NOT NULL DEFAULT 'active',
    PRIMARY KEY (domain, selector)
);
INSERT INTO dkim_keys_rotation (domain, selector, algorithm, private_key, public_key, created_at)
    SELECT domain, selector, algorithm, private_key, public_key, created_at FROM dkim_keys;
DROP TABLE dkim_keys;
ALTER TABLE dkim_keys_rotation RENAME TO dkim_keys;
CREATE UNIQUE INDEX dkim_keys_one_active ON dkim_keys (domain, algorithm) WHERE state = 'active';
