-- The worker fleet: one heartbeat row per running `mailsplit worker`,
-- rewritten every few seconds and deleted when the worker exits cleanly.
-- A row whose seen_at stops moving belongs to a lost worker (killed, or its
-- machine gone). Times in milliseconds since the epoch.
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    version TEXT NOT NULL,
    -- The running executable: SHA-256 of its contents (hex prefix), its
    -- size and modification time, so a deploy shows as a new binary.
    binary_hash TEXT NOT NULL,
    binary_size BIGINT NOT NULL,
    binary_mtime BIGINT NOT NULL,
    relay TEXT NOT NULL,
    concurrency BIGINT NOT NULL,
    -- running, or stopping (told to stop, finishing its jobs).
    state TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    seen_at BIGINT NOT NULL,
    -- Messages this process has recorded as sent, and its recent rate.
    sent BIGINT NOT NULL DEFAULT 0,
    rate DOUBLE PRECISION NOT NULL DEFAULT 0
);
