-- mailsplit schema, SQLite flavour. Keep in step with migrations/postgres.
-- Timestamps are milliseconds since the Unix epoch (BIGINT) so both backends
-- share one Rust type.
CREATE TABLE lists (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

CREATE TABLE recipients (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    attributes TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL DEFAULT 'active',
    updated_at BIGINT NOT NULL
);

CREATE TABLE list_members (
    list_id BIGINT NOT NULL REFERENCES lists (id),
    recipient_id BIGINT NOT NULL REFERENCES recipients (id),
    PRIMARY KEY (list_id, recipient_id)
);

CREATE TABLE campaigns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    list_id BIGINT NOT NULL REFERENCES lists (id),
    template TEXT NOT NULL,
    subject TEXT NOT NULL,
    from_addr TEXT NOT NULL,
    priority BIGINT NOT NULL,
    state TEXT NOT NULL DEFAULT 'draft',
    paused BOOLEAN NOT NULL DEFAULT FALSE,
    enqueue_cursor BIGINT NOT NULL DEFAULT 0,
    pending_upto BIGINT,
    pending_server TEXT,
    pending_after_job BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE campaign_counters (
    campaign_id BIGINT PRIMARY KEY REFERENCES campaigns (id),
    recipients BIGINT NOT NULL DEFAULT 0,
    enqueued BIGINT NOT NULL DEFAULT 0,
    jobs BIGINT NOT NULL DEFAULT 0,
    sent BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    skipped BIGINT NOT NULL DEFAULT 0,
    enqueue_skipped BIGINT NOT NULL DEFAULT 0,
    window_at BIGINT NOT NULL DEFAULT 0,
    window_done BIGINT NOT NULL DEFAULT 0,
    rate DOUBLE PRECISION NOT NULL DEFAULT 0,
    first_at BIGINT,
    last_at BIGINT
);

CREATE TABLE deliveries (
    campaign_id BIGINT NOT NULL,
    recipient_id BIGINT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    claim_token BIGINT,
    claimed_until BIGINT,
    last_error TEXT,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (campaign_id, recipient_id)
);
