ALTER TABLE workers DROP COLUMN foreign_databases;
ALTER TABLE workers DROP COLUMN foreign_jobs;
ALTER TABLE workers DROP COLUMN tube;
