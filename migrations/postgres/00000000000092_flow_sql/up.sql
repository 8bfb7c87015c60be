-- Issue 39: flows started by a query on the shop's database (--trigger-sql).
-- matched_at: when the last complete poll of the query began; seen_at: when
-- a poll last returned the entry's (email, key). An entry whose step is due
-- and whose seen_at is older than its flow's matched_at is no longer
-- returned by the query: it leaves ("no longer matched") instead of
-- getting the step. allow_privileged: `--allow-privileged-source` given
-- at creation (the source's user may do more than read).
ALTER TABLE flows ADD COLUMN matched_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE flows ADD COLUMN allow_privileged BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE flow_entries ADD COLUMN seen_at BIGINT NOT NULL DEFAULT 0;
