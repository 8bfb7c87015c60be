DROP TABLE campaign_engagement;
DROP TABLE engagement;
DROP TABLE campaign_links;
ALTER TABLE campaign_content DROP COLUMN track;
