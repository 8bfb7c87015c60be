-- Whether a webhook may point at this machine or its link (loopback,
-- link-local, unspecified addresses): refused unless `webhook add` was
-- given --allow-local, at add time and again at every delivery.
ALTER TABLE webhooks ADD COLUMN allow_local BOOLEAN NOT NULL DEFAULT FALSE;
