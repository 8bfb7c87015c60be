-- Reports that nobody can vouch for (issue 29): a bounce or complaint
-- without a VERP token or Message-ID that only we could have written, or
-- whose Message-ID names a message the ledger never sent. They change
-- nobody; one row per message (by fingerprint, so a report delivered twice
-- is one row), with how many addresses it named and the first few, so an
-- operator can see forgeries and reports about mail sent before the
-- Message-IDs were signed.
CREATE TABLE unverified_reports (
    id BIGSERIAL PRIMARY KEY,
    fingerprint TEXT NOT NULL UNIQUE,
    format TEXT NOT NULL,
    kind TEXT,
    addresses BIGINT NOT NULL,
    sample TEXT NOT NULL,
    why TEXT NOT NULL,
    received_at BIGINT NOT NULL
);
