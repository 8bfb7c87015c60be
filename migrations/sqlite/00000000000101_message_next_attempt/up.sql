-- When a message's next attempt is due (ms): when it was stored, or, for
-- one put back for a retry, when the delay it was released with ends. The
-- flow scheduler's lease holder puts again the jobs of messages left
-- waiting well past it (beanstalkd restarted without its binlog, a put
-- that failed after the row was stored), through the index, never a scan
-- of the ledger. Rows with an outcome are never looked at; the waiting
-- ones start from when they were stored.
ALTER TABLE messages ADD COLUMN next_attempt_at BIGINT NOT NULL DEFAULT 0;
UPDATE messages SET next_attempt_at = created_at
    WHERE status IN ('queued', 'claimed', 'sending');
CREATE INDEX messages_by_next_attempt ON messages (status, next_attempt_at);
