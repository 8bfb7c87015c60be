DROP INDEX recipients_status_at;
DROP TABLE dkim_keys;
