-- `list prune`: whether a member opened or clicked anything since a time,
-- found by recipient (the table's key starts with the campaign).
CREATE INDEX engagement_by_recipient ON engagement (recipient_id);
