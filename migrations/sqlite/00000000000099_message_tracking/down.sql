DROP TABLE message_engagement;
ALTER TABLE message_templates DROP COLUMN public_url;
ALTER TABLE message_templates DROP COLUMN track;
