-- Issue 24 (delete): campaigns deleted after `enqueue` (scheduled, nothing
-- sent). Their jobs may still sit delayed in beanstalkd; a worker that
-- meets one finds its campaign here and deletes the job instead of burying
-- it as one naming a campaign that never existed.
CREATE TABLE deleted_campaigns (
    id BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    deleted_at BIGINT NOT NULL
);
