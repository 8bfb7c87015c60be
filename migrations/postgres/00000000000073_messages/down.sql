ALTER TABLE webhook_outbox DROP COLUMN message_id;
DROP TABLE messages;
DROP TABLE message_templates;
