DROP INDEX recipients_mailbox;
ALTER TABLE recipients DROP COLUMN email_key;
ALTER TABLE campaigns DROP COLUMN enqueue_lease_until;
ALTER TABLE campaigns DROP COLUMN enqueue_owner;
