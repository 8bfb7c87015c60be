-- Issue 24 (scheduling): when the campaign may start, ms since the epoch;
-- NULL: as soon as it is enqueued. Workers send nothing before it.
ALTER TABLE campaigns ADD COLUMN send_at BIGINT;
