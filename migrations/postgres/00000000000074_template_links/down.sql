ALTER TABLE webhook_outbox DROP COLUMN link_url;
DROP TABLE campaign_template_links;
