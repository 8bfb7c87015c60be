-- The admin dashboard's subscriber search finds addresses by a prefix of
-- their key (`email_key`, already folded to lower case) as a byte range.
-- The unique index on `email_key` follows the database's collation, which
-- orders bytes only under "C"; this one orders them so in any database.
CREATE INDEX recipients_mailbox_bytes ON recipients (email_key COLLATE "C");
