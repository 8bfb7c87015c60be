ALTER TABLE deliveries DROP COLUMN variant;
DROP TABLE campaign_variants;
DROP TABLE campaign_ab;
