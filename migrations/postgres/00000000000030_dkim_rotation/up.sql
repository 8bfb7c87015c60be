-- Issue 27: key rotation. A domain may hold several keys of one algorithm
-- (`dkim rotate` adds one), of which at most one is `active` (it signs);
-- the others are `pending` (made, its TXT record being published) or
-- `retired` (replaced by `dkim activate`; kept so mail signed with it
-- still verifies while its record stays, and to switch back).
ALTER TABLE dkim_keys ADD COLUMN state TEXT NOT NULL DEFAULT 'active';
ALTER TABLE dkim_keys DROP CONSTRAINT dkim_keys_domain_algorithm_key;
CREATE UNIQUE INDEX dkim_keys_one_active ON dkim_keys (domain, algorithm) WHERE state = 'active';
