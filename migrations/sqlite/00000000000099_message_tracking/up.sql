-- Tracking of message-template mail (flow steps): a template asks for it
-- (`template create --track opens,clicks --public-url URL`), as a
-- campaign does; its messages then carry an open pixel and click links
-- whose tokens name the message.
ALTER TABLE message_templates ADD COLUMN track TEXT NOT NULL DEFAULT '';
ALTER TABLE message_templates ADD COLUMN public_url TEXT;

-- What the recipient of one message did with it: first open (a person's,
-- and a machine's apart), first click, and counts. One row per message
-- that was opened or clicked; unique counts are counts of rows.
CREATE TABLE message_engagement (
    message_id BIGINT PRIMARY KEY,
    first_open_at BIGINT,
    opens BIGINT NOT NULL DEFAULT 0,
    first_machine_open_at BIGINT,
    machine_opens BIGINT NOT NULL DEFAULT 0,
    first_click_at BIGINT,
    clicks BIGINT NOT NULL DEFAULT 0
);
