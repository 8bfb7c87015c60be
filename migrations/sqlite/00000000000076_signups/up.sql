-- Sign-ups through `/subscribe` to double-opt-in lists, waiting for the
-- person to confirm (`/confirm/TOKEN`, POST). Nobody is a member of such a
-- list before that, so no campaign can reach them; rows older than 7 days
-- are deleted. The rows of the last day count the confirmation mails sent
-- to an address (at most 3 a day).
CREATE TABLE signups (
    id INTEGER PRIMARY KEY,
    email TEXT NOT NULL,
    email_key TEXT NOT NULL,
    name TEXT NOT NULL,
    list_ids TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    confirmed_at BIGINT
);
CREATE INDEX signups_key ON signups (email_key, created_at);
