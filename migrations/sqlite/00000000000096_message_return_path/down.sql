ALTER TABLE message_templates DROP COLUMN return_path;
