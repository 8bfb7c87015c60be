-- Issue 37: message templates and transactional messages. A template is a
-- name with content versions (each `template edit` adds one); a message is
-- one send of a template's latest version to one address, decided once per
-- idempotency key by the unique index (the body hash tells a retry from a
-- different request under the same key).
CREATE TABLE message_templates (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    stream TEXT NOT NULL,
    version BIGINT NOT NULL,
    subject TEXT NOT NULL,
    from_addr TEXT NOT NULL,
    html TEXT NOT NULL,
    text_body TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- status: queued, claimed, sending (internal: on the wire), sent, failed,
-- bounced, suppressed. A claim is a token with a lease (ms), as the
-- campaign ledger's.
CREATE TABLE messages (
    id BIGSERIAL PRIMARY KEY,
    template_id BIGINT NOT NULL,
    template_name TEXT NOT NULL,
    to_addr TEXT NOT NULL,
    data TEXT NOT NULL,
    idempotency_key TEXT,
    body_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    claim_token BIGINT,
    claimed_until BIGINT NOT NULL DEFAULT 0,
    reply TEXT,
    created_at BIGINT NOT NULL,
    sent_at BIGINT
);
CREATE UNIQUE INDEX messages_by_key ON messages (idempotency_key);

-- Webhook events about a message name it instead of a campaign.
ALTER TABLE webhook_outbox ADD COLUMN message_id BIGINT;
