-- An enqueue intent covers a window of jobs (a page of the list) spread
-- over every beanstalkd server, not one job on one server: the servers and
-- each one's newest job id before the window's first put, as
-- `ADDR AFTER_JOB` separated by commas. An intent left by an older run
-- (one server) is carried over.
ALTER TABLE campaigns ADD COLUMN pending_servers TEXT;
UPDATE campaigns SET pending_servers = pending_server || ' ' || pending_after_job
    WHERE pending_server IS NOT NULL AND pending_after_job IS NOT NULL;
ALTER TABLE campaigns DROP COLUMN pending_server;
ALTER TABLE campaigns DROP COLUMN pending_after_job;
