ALTER TABLE webhooks DROP COLUMN allow_local;
