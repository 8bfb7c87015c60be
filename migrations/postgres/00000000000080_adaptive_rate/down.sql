ALTER TABLE rate_groups DROP COLUMN adapted_reason;
ALTER TABLE rate_groups DROP COLUMN adapted_at;
ALTER TABLE rate_groups DROP COLUMN cut_at;
ALTER TABLE rate_groups DROP COLUMN ceiling;
ALTER TABLE rate_groups DROP COLUMN factor;
