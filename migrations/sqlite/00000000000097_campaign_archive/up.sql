-- Finished campaigns the operator has archived: hidden from the
-- dashboard's list, shown under "Archived campaigns"; nothing else reads
-- it, so archiving changes no figure, report or ledger row.
CREATE TABLE campaign_archive (
    campaign_id BIGINT PRIMARY KEY REFERENCES campaigns (id) ON DELETE CASCADE,
    archived_at BIGINT NOT NULL
);
