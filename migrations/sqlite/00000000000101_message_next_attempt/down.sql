DROP INDEX messages_by_next_attempt;
ALTER TABLE messages DROP COLUMN next_attempt_at;
