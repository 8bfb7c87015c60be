DROP TABLE campaign_archive;
