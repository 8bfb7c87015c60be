-- Issue 39 item 4: A/B tests on campaigns. One row per campaign that has
-- one: the sample (per mille of the list), the wait, the metric, the seed
-- of the keyed hash that draws the sample and splits it, when the wait
-- began (the first worker to meet the campaign running) and the winner
-- (variant number, 0 = A), set once by `UPDATE .. WHERE winner IS NULL`.
CREATE TABLE campaign_ab (
    campaign_id BIGINT PRIMARY KEY,
    sample_permille BIGINT NOT NULL,
    wait_ms BIGINT NOT NULL,
    metric TEXT NOT NULL,
    seed BIGINT NOT NULL,
    started_at BIGINT,
    winner BIGINT,
    decided_at BIGINT
);

-- Variants B, C, … (n from 1; A is the campaign's own content).
CREATE TABLE campaign_variants (
    campaign_id BIGINT NOT NULL,
    n BIGINT NOT NULL,
    subject TEXT NOT NULL,
    PRIMARY KEY (campaign_id, n)
);

-- The variant a recipient was given (NULL: the campaign has no A/B test).
ALTER TABLE deliveries ADD COLUMN variant BIGINT;
