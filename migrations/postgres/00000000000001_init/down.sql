DROP TABLE deliveries;
DROP TABLE campaign_counters;
DROP TABLE campaigns;
DROP TABLE list_members;
DROP TABLE recipients;
DROP TABLE lists;
