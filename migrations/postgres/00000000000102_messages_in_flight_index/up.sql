-- The sweep for lost jobs (`messages_sweep`) is the index's only reader,
-- and it looks only at messages still waiting for an outcome: a message
-- leaves the index when it gets one, so the index holds what is in flight,
-- not the whole ledger (with every message in it, each status write moved
-- its entry and a million sent messages were a million entries).
--
-- The predicate is an OR of equalities, not an IN list: SQLite uses a
-- partial index only when it can prove the query's WHERE implies the
-- index's, and it proves `status = 'queued'` implies an OR of which it is
-- a term, not an IN list. A query must name its status as a literal (a
-- bound `status = ?` proves nothing, nor in PostgreSQL's generic plans).
DROP INDEX messages_by_next_attempt;
CREATE INDEX messages_by_next_attempt ON messages (status, next_attempt_at)
    WHERE status = 'queued' OR status = 'claimed' OR status = 'sending';
