-- Issue 38 item 5: people erased at their request (`subscriber forget`,
-- `DELETE /api/v1/subscribers/{email}`). Nothing of the address is kept
-- but `digest`, an HMAC-SHA256 under the installation's secret of the
-- address's key (`mailbox::key`), hex: without the secret nobody can test
-- an address against it. Imports (CSV, SQL, `--sync`), the API and flow
-- triggers skip an address whose digest is here; only a confirmed
-- double-opt-in sign-up (the person asking again) takes the row away.
-- `suppressed`: the address was on the suppression list when it was
-- forgotten (its entry is deleted with the rest; a confirmation puts it
-- back, so the operator's "never mail" holds).
CREATE TABLE forgotten (
    digest TEXT PRIMARY KEY NOT NULL,
    suppressed BOOLEAN NOT NULL DEFAULT FALSE,
    forgotten_at BIGINT NOT NULL
);
