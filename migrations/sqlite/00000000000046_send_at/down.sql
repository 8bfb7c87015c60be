ALTER TABLE campaigns DROP COLUMN send_at;
