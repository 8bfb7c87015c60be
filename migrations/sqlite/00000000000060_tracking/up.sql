-- Issue 26 (tracking): which of opens and clicks a content version
-- tracks ('' none, 'opens', 'clicks', 'opens,clicks').
ALTER TABLE campaign_content ADD COLUMN track TEXT NOT NULL DEFAULT '';

-- Each tracked content version's own links, numbered from 1: a click on
-- `/c/TOKEN/N` redirects to exactly `url`, never to anything in the
-- request. Extracted once per version; `clicks` counts every click.
CREATE TABLE campaign_links (
    campaign_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    n BIGINT NOT NULL,
    url TEXT NOT NULL,
    clicks BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id, version, n)
);

-- Per recipient and campaign: first open and click, and counts (machine
-- opens, e.g. a mail proxy's prefetch, apart), and when the recipient
-- unsubscribed by this campaign's link.
CREATE TABLE engagement (
    campaign_id BIGINT NOT NULL,
    recipient_id BIGINT NOT NULL,
    first_open_at BIGINT,
    opens BIGINT NOT NULL DEFAULT 0,
    first_machine_open_at BIGINT,
    machine_opens BIGINT NOT NULL DEFAULT 0,
    first_click_at BIGINT,
    clicks BIGINT NOT NULL DEFAULT 0,
    unsubscribed_at BIGINT,
    PRIMARY KEY (campaign_id, recipient_id)
);

-- Per campaign, changed in the same transaction as `engagement` (driven
-- by affected rows), so `status` reads them in O(1): unique recipients
-- (opened, machine_opened, clicked, unsubscribed) and totals.
CREATE TABLE campaign_engagement (
    campaign_id BIGINT NOT NULL PRIMARY KEY,
    opened BIGINT NOT NULL DEFAULT 0,
    opens BIGINT NOT NULL DEFAULT 0,
    machine_opened BIGINT NOT NULL DEFAULT 0,
    machine_opens BIGINT NOT NULL DEFAULT 0,
    clicked BIGINT NOT NULL DEFAULT 0,
    clicks BIGINT NOT NULL DEFAULT 0,
    unsubscribed BIGINT NOT NULL DEFAULT 0
);
