ALTER TABLE webhook_outbox DROP COLUMN link_n;
ALTER TABLE webhook_outbox DROP COLUMN link_version;
