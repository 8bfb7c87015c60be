ALTER TABLE flow_entries DROP COLUMN seen_at;
ALTER TABLE flows DROP COLUMN allow_privileged;
ALTER TABLE flows DROP COLUMN matched_at;
