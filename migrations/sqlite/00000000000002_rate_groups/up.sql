-- Shared rate limits: one GCRA state per group, leased in small batches by
-- every worker through conditional updates. Times in microseconds.
CREATE TABLE rate_groups (
    name TEXT PRIMARY KEY,
    rate DOUBLE PRECISION NOT NULL,
    burst BIGINT NOT NULL,
    tat BIGINT NOT NULL DEFAULT 0,
    leased BIGINT NOT NULL DEFAULT 0,
    window_at BIGINT NOT NULL DEFAULT 0,
    window_leased BIGINT NOT NULL DEFAULT 0,
    observed DOUBLE PRECISION NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL
);
