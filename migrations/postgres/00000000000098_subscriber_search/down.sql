DROP INDEX recipients_mailbox_bytes;
