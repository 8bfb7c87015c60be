-- This database's identity, one row written by `mailsplit migrate`: the id
-- every job carries (a worker on another database leaves the job alone) and
-- the secret every token is signed with (job bodies, unsubscribe links,
-- VERP return paths), so every machine agrees without configuration.
CREATE TABLE installation (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    database_id TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- Why and when a recipient stopped being active (one-click unsubscribe,
-- complaint, hard bounce, import), so nobody wonders later.
ALTER TABLE recipients ADD COLUMN status_reason TEXT;
ALTER TABLE recipients ADD COLUMN status_at BIGINT;

-- Where a campaign's one-click unsubscribe links point (https://…, served
-- by `mailsplit serve` at /u/TOKEN), and its VERP return path
-- (local@bounce-domain → local+TOKEN@bounce-domain). NULL: none.
ALTER TABLE campaigns ADD COLUMN public_url TEXT;
ALTER TABLE campaigns ADD COLUMN return_path TEXT;
