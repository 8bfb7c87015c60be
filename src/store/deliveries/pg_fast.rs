//! The PostgreSQL fast paths: a job's claim and a batch of successes, each
//! one prepared statement and one round trip.

use super::counters::counters_set;
use super::*;
use crate::store::outbox::EventKind;

/// One row of [`claim_pg`]: a member of the job, with its attempt number
/// and its recipient's fields when this claim got it.
#[derive(QueryableByName)]
pub(super) struct ClaimRowPg {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(super) rid: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    pub(super) attempts: Option<i32>,
    #[diesel(embed)]
    pub(super) person: PersonRow,
}

/// The claim on PostgreSQL, with the members of a list (`?` list, `?` ids)
/// or every id given (`?` ids) as the job.
static CLAIM_PG_LIST: LazyLock<String> = LazyLock::new(|| {
    claim_pg_sql(
        "SELECT recipient_id AS rid FROM list_members WHERE list_id = ? AND recipient_id = ANY(?)",
    )
});
static CLAIM_PG_IDS: LazyLock<String> =
    LazyLock::new(|| claim_pg_sql("SELECT DISTINCT rid FROM unnest(?::bigint[]) AS u(rid)"));

/// The database server's clock in ms. Leases on PostgreSQL are set and
/// judged on it, not on each worker's: a worker whose clock is ahead (a
/// step, a bad NTP source) would otherwise take over live claims early.
pub(super) const DB_NOW_MS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// One `INSERT … ON CONFLICT DO UPDATE … WHERE <claimable> RETURNING` that
/// inserts what is new and takes over rows waiting for a retry or left by a
/// dead worker (lease over), and leaves anything else alone. Its result is
/// one row per member (`attempts` NULL where another holds it or it is
/// finished), joined to the recipients this claim got, with the attributes
/// named by the last bind (a JSON array; JSON `null` for all). In id order,
/// so two workers claiming overlapping jobs lock rows in the same order.
fn claim_pg_sql(members: &str) -> String {
    let (claimed, retry) = (
        DeliveryState::Claimed.as_str(),
        DeliveryState::Retry.as_str(),
    );
    format!(
        "WITH m AS MATERIALIZED ({members}), \
         c AS ( \
           INSERT INTO deliveries AS d \
             (campaign_id, recipient_id, state, attempts, claim_token, claimed_until, updated_at) \
           SELECT ?::bigint, m.rid, '{claimed}', 1, ?::bigint, t.now + ?::bigint, t.now \
             FROM m, ({DB_NOW_MS}) AS t(now) ORDER BY m.rid \
           ON CONFLICT (campaign_id, recipient_id) DO UPDATE \
             SET state = '{claimed}', attempts = d.attempts + 1, \
                 claim_token = excluded.claim_token, claimed_until = excluded.claimed_until, \
                 updated_at = excluded.updated_at \
             WHERE d.state = '{retry}' \
                OR (d.state = '{claimed}' AND d.claimed_until < excluded.updated_at) \
           RETURNING d.recipient_id AS rid, d.attempts), \
         k AS (SELECT NULLIF(?::jsonb, 'null'::jsonb) AS keep) \
         SELECT m.rid, c.attempts, r.email, r.name, \
           CASE WHEN k.keep IS NULL THEN r.attributes ELSE \
             COALESCE((SELECT jsonb_object_agg(e.key, e.value) \
                       FROM jsonb_each(r.attributes::jsonb) AS e \
                       WHERE e.key IN (SELECT jsonb_array_elements_text(k.keep))), '{{}}')::text \
           END AS attributes, r.status \
         FROM m CROSS JOIN k LEFT JOIN c ON c.rid = m.rid LEFT JOIN recipients AS r ON r.id = c.rid \
         ORDER BY m.rid"
    )
}

pub(super) fn claim_pg(
    c: &mut diesel::pg::PgConnection,
    list_id: Option<i64>,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
    keep: &str,
) -> Result<Vec<ClaimRowPg>> {
    let (sql, mut binds) = match list_id {
        Some(list) => (&*CLAIM_PG_LIST, vec![Bind::Int(list)]),
        None => (&*CLAIM_PG_IDS, vec![]),
    };
    binds.extend([
        Bind::Ints(recipient_ids),
        Bind::Int(campaign_id),
        Bind::Int(token),
        Bind::Int(lease_ms),
        Bind::Text(keep),
    ]);
    Ok(Prepared::new(sql, binds).load(c)?)
}

/// The statement of [`record_sent_pg`]: one text for every batch, so each
/// connection prepares it once (see [`super::prepared`]).
static RECORD_SENT_PG: LazyLock<String> = LazyLock::new(|| record_sent_pg_sql(""));

/// [`RECORD_SENT_PG`] that also writes a `sent` event into the outbox for
/// each row marked and each webhook in the last bound array, in the same
/// statement (so in the same transaction as the fact).
static RECORD_SENT_PG_EVENTS: LazyLock<String> = LazyLock::new(|| {
    record_sent_pg_sql(&format!(
        "ev AS (INSERT INTO webhook_outbox (webhook_id, kind, campaign_id, recipient_id, at) \
           SELECT h.id, '{}', p.campaign, done.rid, p.now \
           FROM done, p, unnest(?::bigint[]) AS h(id) ORDER BY done.rid, h.id), ",
        EventKind::Sent.as_str()
    ))
});

/// The statement of [`record_sent_pg`], with `events` (a WITH clause, or
/// nothing) before its counters' update.
fn record_sent_pg_sql(events: &str) -> String {
    let (sent, claimed) = (
        DeliveryState::Sent.as_str(),
        DeliveryState::Claimed.as_str(),
    );
    let set = counters_set("n.k", "0", "0", "0", "p.now");
    // Data-modifying WITH clauses run exactly once whether or not the SELECT
    // reads them, all on one snapshot. The campaign comes from the array
    // too, not as a value of its own: with a single campaign, a planner
    // whose statistics still see a small `deliveries` (a new campaign grows
    // it faster than autovacuum looks) scanned the campaign's whole key
    // range for its claimed rows and joined the batch to it, slower with
    // every batch as the campaign grew (BENCHMARKS.md). Without it, the
    // only way in is one primary-key probe per outcome.
    format!(
        "WITH p AS (SELECT ?::bigint AS now, ?::bigint AS campaign), \
         done AS ( \
           UPDATE deliveries AS d \
           SET state = '{sent}', claim_token = NULL, last_error = NULL, updated_at = p.now, \
               content_version = NULLIF(o.ver, 0) \
           FROM p, unnest(?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[]) AS o(cid, rid, tok, ver) \
           WHERE d.campaign_id = o.cid AND d.recipient_id = o.rid \
             AND d.claim_token = o.tok AND d.state = '{claimed}' \
           RETURNING d.recipient_id AS rid, o.tok AS tok), \
         n AS (SELECT count(*) AS k FROM done), {events}\
         bump AS (UPDATE campaign_counters SET {set} \
           FROM n, p WHERE campaign_id = p.campaign AND n.k > 0) \
         SELECT rid, tok FROM done"
    )
}

/// PostgreSQL, a batch of successes only (nearly every batch): for each
/// campaign, one statement marks `sent` the rows still claimed by their
/// outcome's token and moves the counters by the rows it marked. A
/// statement is atomic by itself, so there is no BEGIN and COMMIT: one
/// round trip instead of four, and the counters row is locked for the
/// statement alone, not across round trips up to a COMMIT (what bound
/// workers a LAN hop away from the database).
pub(super) fn record_sent_pg(
    c: &mut diesel::pg::PgConnection,
    outcomes: &[Outcome],
    now: i64,
    hooks: &[i64],
) -> Result<Vec<Recorded>> {
    use diesel::sql_types::BigInt;

    #[derive(QueryableByName)]
    struct Marked {
        #[diesel(sql_type = BigInt)]
        rid: i64,
        #[diesel(sql_type = BigInt)]
        tok: i64,
    }

    let mut results = vec![Recorded::Lost; outcomes.len()];
    let mut by_campaign: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, o) in outcomes.iter().enumerate() {
        by_campaign.entry(o.campaign_id).or_default().push(i);
    }
    for (campaign_id, idx) in by_campaign {
        let cids: Vec<i64> = vec![campaign_id; idx.len()];
        let rids: Vec<i64> = idx.iter().map(|&i| outcomes[i].recipient_id).collect();
        let toks: Vec<i64> = idx.iter().map(|&i| outcomes[i].token).collect();
        // 0: not known (NULL in the ledger).
        let vers: Vec<i64> = idx
            .iter()
            .map(|&i| outcomes[i].content_version.unwrap_or(0))
            .collect();
        let mut binds = vec![
            Bind::Int(now),
            Bind::Int(campaign_id),
            Bind::Ints(&cids),
            Bind::Ints(&rids),
            Bind::Ints(&toks),
            Bind::Ints(&vers),
        ];
        let sql = if hooks.is_empty() {
            &*RECORD_SENT_PG
        } else {
            binds.push(Bind::Ints(hooks));
            &*RECORD_SENT_PG_EVENTS
        };
        let marked: Vec<Marked> = Prepared::new(sql, binds).load(c)?;
        let marked: HashSet<(i64, i64)> = marked.into_iter().map(|m| (m.rid, m.tok)).collect();
        for i in idx {
            let o = &outcomes[i];
            if marked.contains(&(o.recipient_id, o.token)) {
                results[i] = Recorded::Final;
            }
        }
    }
    Ok(results)
}
