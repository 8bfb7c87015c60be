-- Shared connection limits per relay (`rate set relay:HOST:PORT … --connections N`)
-- and the slots each worker holds. A worker's lease row says how many
-- sessions it may have open; it renews the row every few seconds, and a
-- row whose `until` (ms since the epoch) has passed no longer counts, so a
-- crashed worker's slots come back by themselves.
CREATE TABLE connection_limits (
    name TEXT PRIMARY KEY,
    connections BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE TABLE connection_leases (
    name TEXT NOT NULL,
    owner TEXT NOT NULL,
    slots BIGINT NOT NULL,
    -- Senders of this worker waiting for a slot (for a fair share).
    waiting BIGINT NOT NULL,
    until BIGINT NOT NULL,
    PRIMARY KEY (name, owner)
);
