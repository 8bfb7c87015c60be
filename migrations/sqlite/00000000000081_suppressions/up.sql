-- The global suppression list (`mailsplit suppress`): an address's key
-- (`mailbox::key`: local part folded, domain as a lower-case A-label) or
-- `@` and a domain. The primary key is the one index a worker's claim
-- looks a batch's addresses and domains up in, in one statement.
CREATE TABLE suppressions (
    entry TEXT PRIMARY KEY NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL
);
