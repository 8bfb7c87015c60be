-- A `clicked` event names the link that was clicked: its content version
-- and number, so the deliverer can send the link's URL (campaign_links).
ALTER TABLE webhook_outbox ADD COLUMN link_version BIGINT;
ALTER TABLE webhook_outbox ADD COLUMN link_n BIGINT;
