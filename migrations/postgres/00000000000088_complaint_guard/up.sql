-- The complaint guard: complaints (ARF reports read by `mailsplit bounce`)
-- over this share of the messages delivered pause the campaign, once
-- 1,000 are delivered (see store/autopause.rs). NULL: off. Campaigns made
-- before it get the default, Gmail's and Yahoo's bulk-sender limit.
ALTER TABLE campaigns ADD COLUMN max_complaint_rate DOUBLE PRECISION DEFAULT 0.003;
