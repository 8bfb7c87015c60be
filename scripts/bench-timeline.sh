#!/bin/sh
# The campaign page's timeline query (src/store/timeline.rs) on PostgreSQL
# at a million ledger rows: builds a scratch database with the ledger's
# shape (a 1M-row campaign over 3 hours and a 200k-row one), then runs
# EXPLAIN (ANALYZE, BUFFERS) of the query outcomes() builds, three times
# each. Usage: scripts/bench-timeline.sh [psql connection options]
# (default -h 127.0.0.1 -U root). Drops the scratch database at the end.
set -eu
PSQL="psql -X -q ${*:--h 127.0.0.1 -U root}"
DB=mailsplit_bench_timeline
$PSQL -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
$PSQL -d $DB <<'SQL'
CREATE TABLE deliveries (
    campaign_id BIGINT NOT NULL, recipient_id BIGINT NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, claim_token BIGINT, claimed_until BIGINT,
    last_error TEXT, updated_at BIGINT NOT NULL, bounced_at BIGINT, complained_at BIGINT,
    content_version BIGINT, PRIMARY KEY (campaign_id, recipient_id)) WITH (fillfactor = 50);
INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at)
SELECT 1, g, CASE WHEN g % 37 = 0 THEN 'failed' WHEN g % 101 = 0 THEN 'skipped' ELSE 'sent' END,
       1, 1764156000000 + (g::bigint * 10800000 / 1000000) FROM generate_series(1, 1000000) g;
INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at)
SELECT 2, g, 'sent', 1, 1764156000000 + g FROM generate_series(1, 200000) g;
VACUUM ANALYZE deliveries;
SQL
for campaign in 1 2; do
    for _ in 1 2 3; do
        $PSQL -d $DB -c "EXPLAIN (ANALYZE, BUFFERS) SELECT CASE WHEN updated_at < 1764156000000 THEN 0 \
            WHEN updated_at >= 1764166920000 THEN 90 ELSE (updated_at - 1764156000000) / 120000 END AS bucket, \
            state, COUNT(*) AS n FROM deliveries WHERE campaign_id = $campaign \
            AND state IN ('sent', 'failed') GROUP BY 1, 2" | grep -E 'Scan|Execution Time'
    done
done
$PSQL -d postgres -c "DROP DATABASE $DB"
