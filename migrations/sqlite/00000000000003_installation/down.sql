ALTER TABLE campaigns DROP COLUMN return_path;
ALTER TABLE campaigns DROP COLUMN public_url;
ALTER TABLE recipients DROP COLUMN status_at;
ALTER TABLE recipients DROP COLUMN status_reason;
DROP TABLE installation;
