-- The adapted rate of a group: a throttling reply from the relay or a
-- recipient domain cuts the share of the configured rate every worker
-- leases at (`factor`), at most once per interval (`cut_at`, ms); clean
-- replies bring it back step by step (`adapted_at`, ms, the last change).
-- `ceiling` is the rate (tokens/s) at which the last throttle came, so the
-- recovery slows down before reaching it again.
ALTER TABLE rate_groups ADD COLUMN factor DOUBLE PRECISION NOT NULL DEFAULT 1;
ALTER TABLE rate_groups ADD COLUMN ceiling DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE rate_groups ADD COLUMN cut_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rate_groups ADD COLUMN adapted_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rate_groups ADD COLUMN adapted_reason TEXT;
