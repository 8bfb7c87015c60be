-- What each worker reserves from, and the jobs of other databases it met
-- there (moved at once to their own tubes, mailsplit-<database id>), so
-- `workers` and `status` can say plainly that a tube is shared.
ALTER TABLE workers ADD COLUMN tube TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN foreign_jobs BIGINT NOT NULL DEFAULT 0;
-- The other databases' ids, comma-separated.
ALTER TABLE workers ADD COLUMN foreign_databases TEXT NOT NULL DEFAULT '';
