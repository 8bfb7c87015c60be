-- Issue 39: flows. A flow sends its steps (marketing-stream message
-- templates) to each entry after each step's delay from the entry. An
-- entry is one (flow, recipient, key): made once when a member joins the
-- flow's list (key '') or a SQL trigger returns the row (the row's key).
CREATE TABLE flows (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    -- join | sql
    trigger_kind TEXT NOT NULL,
    list_id BIGINT,
    sql_query TEXT,
    sql_source TEXT,
    every_ms BIGINT,
    polled_at BIGINT NOT NULL DEFAULT 0,
    -- active | paused
    state TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX flows_by_list ON flows (list_id);

-- Steps in order (n from 0); the delay counts from the entry.
CREATE TABLE flow_steps (
    flow_id BIGINT NOT NULL,
    n BIGINT NOT NULL,
    delay_ms BIGINT NOT NULL,
    template TEXT NOT NULL,
    PRIMARY KEY (flow_id, n)
);

-- state: active (due_at set), done, left (left_reason: unsubscribed,
-- bounced, complained, suppressed, removed, gone). next_step: the step
-- the scheduler sends next. Due work is found by flow_entries_due,
-- whatever the number of entries.
CREATE TABLE flow_entries (
    id BIGSERIAL PRIMARY KEY,
    flow_id BIGINT NOT NULL,
    recipient_id BIGINT NOT NULL,
    entry_key TEXT NOT NULL DEFAULT '',
    row_data TEXT NOT NULL DEFAULT '{}',
    next_step BIGINT NOT NULL DEFAULT 0,
    due_at BIGINT,
    state TEXT NOT NULL,
    left_reason TEXT,
    entered_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX flow_entries_once ON flow_entries (flow_id, recipient_id, entry_key);
CREATE INDEX flow_entries_due ON flow_entries (due_at) WHERE due_at IS NOT NULL;

-- One row: the database lease of the worker that schedules flow steps.
CREATE TABLE flow_scheduler (
    id BIGINT PRIMARY KEY,
    owner TEXT,
    lease_until BIGINT NOT NULL DEFAULT 0
);
INSERT INTO flow_scheduler (id, owner, lease_until) VALUES (1, NULL, 0);
