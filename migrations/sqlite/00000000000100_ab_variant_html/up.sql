-- Issue 39: A/B variants with HTML of their own (`--variant-html`). Such a
-- variant's content is a content version like any other, so its links get
-- a link table of their own and a click on one credits and redirects by
-- that version; `variant` keeps it out of what the campaign itself sends
-- (0: the campaign's own content, n: variant n's).
ALTER TABLE campaign_content ADD COLUMN variant BIGINT NOT NULL DEFAULT 0;

-- The content version of a variant with HTML of its own (NULL: variant
-- A's content). A variant's `subject` is '' when it has none of its own
-- and takes variant A's current one.
ALTER TABLE campaign_variants ADD COLUMN content_version BIGINT;
