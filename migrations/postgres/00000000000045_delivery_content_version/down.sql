ALTER TABLE deliveries DROP COLUMN content_version;
