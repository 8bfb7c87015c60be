-- Issue 26 item 4: signed event webhooks out. A webhook is a receiver URL,
-- the event kinds it wants (comma-separated) and its signing secret; one
-- process at a time delivers it (lease_owner until lease_until, ms). The
-- outbox holds one row per (webhook, event), written in the transaction of
-- the fact it reports, deleted once delivered or given up.
CREATE TABLE webhooks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    lease_owner TEXT,
    lease_until BIGINT NOT NULL DEFAULT 0,
    next_at BIGINT NOT NULL DEFAULT 0,
    attempts BIGINT NOT NULL DEFAULT 0,
    delivered BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    posts BIGINT NOT NULL DEFAULT 0,
    last_error TEXT,
    last_error_at BIGINT,
    last_ok_at BIGINT
);

CREATE TABLE webhook_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id BIGINT NOT NULL,
    kind TEXT NOT NULL,
    campaign_id BIGINT,
    recipient_id BIGINT,
    at BIGINT NOT NULL
);
CREATE INDEX webhook_outbox_by_webhook ON webhook_outbox (webhook_id, id);

-- `campaign.finished` is reported once: when the campaign was seen done.
ALTER TABLE campaign_counters ADD COLUMN finished_at BIGINT;
UPDATE campaign_counters SET finished_at = COALESCE(last_at, 0)
 WHERE recipients <= sent + failed + skipped
   AND campaign_id IN (SELECT id FROM campaigns WHERE state = 'queued');

-- `mailsplit report`: bounce reasons of one campaign.
CREATE INDEX bounces_by_campaign ON bounces (campaign_id);
