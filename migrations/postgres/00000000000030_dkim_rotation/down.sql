-- Back to one key per (domain, algorithm): only the active keys stay.
DROP INDEX dkim_keys_one_active;
DELETE FROM dkim_keys WHERE state <> 'active';
ALTER TABLE dkim_keys DROP COLUMN state;
ALTER TABLE dkim_keys ADD CONSTRAINT dkim_keys_domain_algorithm_key UNIQUE (domain, algorithm);
