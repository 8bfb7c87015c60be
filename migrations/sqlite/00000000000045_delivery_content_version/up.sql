-- Issue 24 (campaign edit): which content version each recipient got,
-- written with the `sent` state; NULL before anything was sent, and for
-- messages sent before this column existed.
ALTER TABLE deliveries ADD COLUMN content_version BIGINT;
