-- The admin dashboard's subscriber search finds addresses by a prefix of
-- their key (`email_key`, already folded to lower case) as a byte range.
-- SQLite's unique index on `email_key` (BINARY collation) orders bytes
-- already and serves that range; nothing to add here.
SELECT 1;
