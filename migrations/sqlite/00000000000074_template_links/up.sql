-- Clicks on links a content version's template writes (`href="{{ p.url
-- }}"`): they have no number in `campaign_links`, so they are counted by
-- the URL the render produced (and `/l/TOKEN?u=URL` verified as such).
CREATE TABLE campaign_template_links (
    campaign_id BIGINT NOT NULL,
    url TEXT NOT NULL,
    clicks BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign_id, url)
);

-- A `clicked` event on such a link carries its URL itself.
ALTER TABLE webhook_outbox ADD COLUMN link_url TEXT;
