DROP TABLE deleted_campaigns;
