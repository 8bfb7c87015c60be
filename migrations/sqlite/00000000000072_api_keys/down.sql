ALTER TABLE recipients DROP COLUMN created_at;
DROP TABLE api_keys;
