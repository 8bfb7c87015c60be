-- One `enqueue` of a campaign at a time: a run takes the campaign with a
-- conditional UPDATE (owner and lease, ms since the epoch) and renews the
-- lease with every step; a run killed with -9 gives it up when the lease
-- runs out.
ALTER TABLE campaigns ADD COLUMN enqueue_owner TEXT;
ALTER TABLE campaigns ADD COLUMN enqueue_lease_until BIGINT;

-- One recipient per mailbox: `email_key` is the address with its local
-- part in lower case and its domain as a lower-case A-label (see
-- src/mailbox.rs); `email` keeps the spelling mail is sent to. ASCII
-- addresses get their key here; the others (IDNA needs code) get it from
-- `mailsplit migrate` right after this migration.
ALTER TABLE recipients ADD COLUMN email_key TEXT;
UPDATE recipients SET email_key = lower(email) WHERE email NOT GLOB '*[^ -~]*';

-- Mailboxes imported twice under two spellings: the oldest row stays the
-- recipient; each later twin stops being mailed (unsubscribed, with the
-- reason) and the oldest row joins its lists. An unsubscribe or bounce
-- under either spelling holds for the mailbox. The twins keep their rows
-- (and their ledger history) with no key.
CREATE TEMPORARY TABLE mailbox_twins AS
SELECT r.id AS id, k.keeper AS keeper, r.status AS status, r.status_reason AS reason
FROM recipients r
JOIN (SELECT email_key, MIN(id) AS keeper FROM recipients
      WHERE email_key IS NOT NULL GROUP BY email_key HAVING COUNT(*) > 1) k
  ON r.email_key = k.email_key
WHERE r.id <> k.keeper;

UPDATE recipients SET
    status = (SELECT t.status FROM mailbox_twins t
              WHERE t.keeper = recipients.id AND t.status <> 'active' ORDER BY t.id LIMIT 1),
    status_reason = (SELECT COALESCE(t.reason, t.status) || ' (as recipient ' || t.id || ')'
                     FROM mailbox_twins t
                     WHERE t.keeper = recipients.id AND t.status <> 'active' ORDER BY t.id LIMIT 1),
    status_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
WHERE status = 'active'
  AND id IN (SELECT keeper FROM mailbox_twins WHERE status <> 'active');

INSERT OR IGNORE INTO list_members (list_id, recipient_id)
SELECT lm.list_id, t.keeper FROM list_members lm JOIN mailbox_twins t ON t.id = lm.recipient_id;

UPDATE recipients SET
    email_key = NULL,
    status_reason = CASE WHEN status = 'active'
        THEN 'same mailbox as recipient ' || (SELECT keeper FROM mailbox_twins t WHERE t.id = recipients.id)
        ELSE status_reason END,
    status_at = CASE WHEN status = 'active'
        THEN CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) ELSE status_at END,
    status = CASE WHEN status = 'active' THEN 'unsubscribed' ELSE status END
WHERE id IN (SELECT id FROM mailbox_twins);

DROP TABLE mailbox_twins;

CREATE UNIQUE INDEX recipients_mailbox ON recipients (email_key);
