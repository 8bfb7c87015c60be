DROP INDEX bounces_by_campaign;
ALTER TABLE campaign_counters DROP COLUMN finished_at;
DROP TABLE webhook_outbox;
DROP TABLE webhooks;
