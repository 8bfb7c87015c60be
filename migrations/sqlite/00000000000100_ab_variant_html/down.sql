ALTER TABLE campaign_variants DROP COLUMN content_version;
ALTER TABLE campaign_content DROP COLUMN variant;
