-- A message template's VERP return path (`template create --return-path`):
-- its messages' envelope sender becomes local+TOKEN@domain, TOKEN naming
-- the message, so a later bounce marks that message `bounced`.
ALTER TABLE message_templates ADD COLUMN return_path TEXT;
