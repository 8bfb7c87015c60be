DROP INDEX messages_by_next_attempt;
CREATE INDEX messages_by_next_attempt ON messages (status, next_attempt_at);
