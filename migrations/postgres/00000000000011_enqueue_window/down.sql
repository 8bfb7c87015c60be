ALTER TABLE campaigns ADD COLUMN pending_server TEXT;
ALTER TABLE campaigns ADD COLUMN pending_after_job BIGINT;
-- A window's intent has no single-job form: a re-run of the older binary
-- finds none and scans the window again from the cursor (the ledger's claim
-- still sends each recipient once).
UPDATE campaigns SET pending_upto = NULL;
ALTER TABLE campaigns DROP COLUMN pending_servers;
