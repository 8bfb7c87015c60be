DROP TABLE campaign_content;
