-- What comes back after a send (issue 13): bounce reports (DSNs and the
-- common non-standard ones), complaints (ARF, JMRP, SES), provider
-- webhooks, and 5.1.x refusals at send time, one row per event and
-- recipient. `fingerprint` names the message an event came from (a hash of
-- it, or `smtp:CAMPAIGN` / `webhook:HASH`), so a report delivered twice
-- (Postfix retrying a pipe, a Maildir file handled again) is recorded once.
CREATE TABLE bounces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient_id BIGINT NOT NULL REFERENCES recipients (id),
    campaign_id BIGINT,
    email TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT,
    reason TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    UNIQUE (fingerprint, recipient_id)
);
-- Soft bounces of one recipient within a window.
CREATE INDEX bounces_by_recipient ON bounces (recipient_id, kind, received_at);

-- The ledger remembers that a sent message bounced or drew a complaint, so
-- the campaign counters below equal a COUNT(*) over it, like the others.
ALTER TABLE deliveries ADD COLUMN bounced_at BIGINT;
ALTER TABLE deliveries ADD COLUMN complained_at BIGINT;

ALTER TABLE campaign_counters ADD COLUMN bounced BIGINT NOT NULL DEFAULT 0;
ALTER TABLE campaign_counters ADD COLUMN complaints BIGINT NOT NULL DEFAULT 0;
-- Auto-pause: failures since the last success, and the failure rate over
-- the last 250 to 500 messages (the current bucket and the one before).
ALTER TABLE campaign_counters ADD COLUMN fail_streak BIGINT NOT NULL DEFAULT 0;
ALTER TABLE campaign_counters ADD COLUMN recent_done BIGINT NOT NULL DEFAULT 0;
ALTER TABLE campaign_counters ADD COLUMN recent_failed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE campaign_counters ADD COLUMN prior_done BIGINT NOT NULL DEFAULT 0;
ALTER TABLE campaign_counters ADD COLUMN prior_failed BIGINT NOT NULL DEFAULT 0;

-- The failure rate above which workers pause the campaign (NULL: never),
-- and why a campaign was paused by them.
ALTER TABLE campaigns ADD COLUMN max_failure_rate DOUBLE PRECISION DEFAULT 0.2;
ALTER TABLE campaigns ADD COLUMN pause_reason TEXT;
