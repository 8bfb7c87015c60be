//! The deliveries ledger: one row per (campaign, recipient), claimed before a
//! send with a conditional write and finalised after it. A recipient whose row
//! is `sent`, `failed` or `skipped` is never claimed again, whoever holds the
//! job and however often it comes back.

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use diesel::prelude::*;

use super::prepared::{Bind, Prepared};
use super::recipients::{self as recipients_store, Recipient, RecipientStatus};
use super::schema::{deliveries as d, recipients};
use super::{autopause, bounces, now_ms, on, Backend, Conn, InnerMut, Result, StoreError};

/// Rows of one campaign still claimed by `token`.
macro_rules! owned_rows {
    ($campaign_id:expr, $token:expr, $ids:expr) => {
        d::table
            .filter(d::campaign_id.eq($campaign_id))
            .filter(d::recipient_id.eq_any($ids))
            .filter(d::claim_token.eq(Some($token)))
            .filter(d::state.eq(DeliveryState::Claimed))
    };
}

text_enum! {
    /// Where one (campaign, recipient) row of the ledger stands.
    pub enum DeliveryState ("delivery state") {
        /// A worker holds it until `claimed_until`.
        Claimed = "claimed",
        /// Waiting for another try (transient failure, or handed back unsent).
        Retry = "retry",
        Sent = "sent",
        Failed = "failed",
        Skipped = "skipped",
    }
}

/// Rows per statement when claiming on SQLite (7 bound values per row, well
/// under SQLite's limit of 32,766).
const SQLITE_CHUNK: usize = 1_000;

/// recipient, state, claim token, claimed until, attempts.
type ClaimRow = (i64, DeliveryState, Option<i64>, Option<i64>, i32);

/// The result of claiming a job's recipients.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Recipients this claim owns, with the attempt number this try is.
    pub owned: Vec<(i64, i32)>,
    /// Recipients already sent, failed or skipped: nothing to do.
    pub finished: usize,
    /// Some recipients are claimed by another live worker until this time
    /// (ms); the job must come back after it rather than be deleted.
    pub busy_until: Option<i64>,
}

/// A job's claim with what the worker needs to send it.
#[derive(Debug, Default)]
pub struct JobClaim {
    pub claim: Claim,
    /// The owned recipients, read after the claim (a recipient who bounced
    /// or left since enqueue is seen as such), in id order.
    pub people: Vec<Recipient>,
    /// How many of the job's ids are members of the list (each once).
    pub members: usize,
}

/// Claim a job: of `recipient_ids`, only the members of list `list_id` (a
/// job names recipient ids, and only the campaign's own list may be mailed,
/// whatever a job says), as [`claim`] does, and read the recipients it got.
/// On PostgreSQL this is one prepared statement, one round trip.
pub fn claim_job(
    conn: &mut Conn,
    campaign_id: i64,
    list_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
) -> Result<JobClaim> {
    if let InnerMut::Pg(c) = conn.inner_mut() {
        let rows = claim_pg(
            c,
            Some(list_id),
            campaign_id,
            recipient_ids,
            token,
            lease_ms,
        )?;
        let members: Vec<i64> = rows.iter().map(|r| r.rid).collect();
        let mut claim = Claim::default();
        let mut people = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(attempts) = row.attempts else {
                continue;
            };
            claim.owned.push((row.rid, attempts));
            if let (Some(email), Some(name), Some(attributes), Some(status)) =
                (row.email, row.name, row.attributes, row.status)
            {
                people.push(Recipient {
                    id: row.rid,
                    email,
                    name,
                    attributes,
                    status,
                });
            }
        }
        let claim = settle(conn, claim, campaign_id, &members, token)?;
        return Ok(JobClaim {
            claim,
            people,
            members: members.len(),
        });
    }
    let ids = recipients_store::members_among(conn, list_id, recipient_ids)?;
    let claim = claim(conn, campaign_id, &ids, token, lease_ms)?;
    let owned: Vec<i64> = claim.owned.iter().map(|&(rid, _)| rid).collect();
    let mut people = recipients_store::load(conn, &owned)?;
    people.sort_unstable_by_key(|r| r.id);
    Ok(JobClaim {
        claim,
        people,
        members: ids.len(),
    })
}

/// Claim every claimable recipient of a job for `token` until `now + lease`.
/// Claimable: never seen, waiting for a retry, or claimed by somebody whose
/// lease ran out (a dead worker).
pub fn claim(
    conn: &mut Conn,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
) -> Result<Claim> {
    let take = |conn: &mut Conn| {
        let owned = match conn.inner_mut() {
            InnerMut::Pg(c) => claim_pg(c, None, campaign_id, recipient_ids, token, lease_ms)?
                .into_iter()
                .filter_map(|r| Some((r.rid, r.attempts?)))
                .collect(),
            InnerMut::Sqlite(c) => claim_sqlite(c, campaign_id, recipient_ids, token, lease_ms)?,
        };
        let claim = Claim {
            owned,
            ..Claim::default()
        };
        settle(conn, claim, campaign_id, recipient_ids, token)
    };
    match conn.backend() {
        // On PostgreSQL the claim is one statement, atomic by itself, and
        // the rare read after it gets a snapshot of its own either way (READ
        // COMMITTED): no BEGIN and COMMIT, two round trips fewer per job.
        Backend::Postgres => take(conn),
        // SQLite: three statements, one commit (and one fsync) for them.
        Backend::Sqlite => conn.transaction(take),
    }
}

/// SQLite cannot batch an upsert that says which rows it took: insert what
/// is new, take over rows waiting for a retry or left by a dead worker
/// (lease over), then read back what carries our token (the token is new
/// for every claim, so only this call's rows do). Anything else is left
/// alone. Returns what this claim got, with the attempt each is on.
fn claim_sqlite(
    c: &mut diesel::sqlite::SqliteConnection,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
) -> Result<Vec<(i64, i32)>> {
    let now = now_ms();
    let until = now + lease_ms;
    let mut owned = Vec::with_capacity(recipient_ids.len());
    for ids in recipient_ids.chunks(SQLITE_CHUNK) {
        let fresh: Vec<_> = ids
            .iter()
            .map(|&rid| {
                (
                    d::campaign_id.eq(campaign_id),
                    d::recipient_id.eq(rid),
                    d::state.eq(DeliveryState::Claimed),
                    d::attempts.eq(1),
                    d::claim_token.eq(Some(token)),
                    d::claimed_until.eq(Some(until)),
                    d::updated_at.eq(now),
                )
            })
            .collect();
        diesel::insert_or_ignore_into(d::table)
            .values(&fresh)
            .execute(c)?;
        diesel::update(
            d::table
                .filter(d::campaign_id.eq(campaign_id))
                .filter(d::recipient_id.eq_any(ids))
                .filter(
                    d::state.eq(DeliveryState::Retry).or(d::state
                        .eq(DeliveryState::Claimed)
                        .and(d::claimed_until.lt(now))),
                ),
        )
        .set((
            d::state.eq(DeliveryState::Claimed),
            d::attempts.eq(d::attempts + 1),
            d::claim_token.eq(Some(token)),
            d::claimed_until.eq(Some(until)),
            d::updated_at.eq(now),
        ))
        .execute(c)?;
        owned.extend(
            owned_rows!(campaign_id, token, ids)
                .select((d::recipient_id, d::attempts))
                .load::<(i64, i32)>(c)?,
        );
    }
    Ok(owned)
}

/// One row of [`claim_pg`]: a member of the job, with its attempt number
/// and its recipient's fields when this claim got it.
#[derive(QueryableByName)]
struct ClaimRowPg {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    rid: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    attempts: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    email: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    name: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    attributes: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    status: Option<RecipientStatus>,
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

/// One `INSERT … ON CONFLICT DO UPDATE … WHERE <claimable> RETURNING` that
/// inserts what is new and takes over rows waiting for a retry or left by a
/// dead worker (lease over), and leaves anything else alone. Its result is
/// one row per member (`attempts` NULL where another holds it or it is
/// finished), joined to the recipients this claim got. In id order, so two
/// workers claiming overlapping jobs lock rows in the same order.
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
           SELECT ?::bigint, m.rid, '{claimed}', 1, ?::bigint, ?::bigint, ?::bigint \
             FROM m ORDER BY m.rid \
           ON CONFLICT (campaign_id, recipient_id) DO UPDATE \
             SET state = '{claimed}', attempts = d.attempts + 1, \
                 claim_token = excluded.claim_token, claimed_until = excluded.claimed_until, \
                 updated_at = excluded.updated_at \
             WHERE d.state = '{retry}' \
                OR (d.state = '{claimed}' AND d.claimed_until < excluded.updated_at) \
           RETURNING d.recipient_id AS rid, d.attempts) \
         SELECT m.rid, c.attempts, r.email, r.name, r.attributes, r.status \
         FROM m LEFT JOIN c ON c.rid = m.rid LEFT JOIN recipients AS r ON r.id = c.rid \
         ORDER BY m.rid"
    )
}

fn claim_pg(
    c: &mut diesel::pg::PgConnection,
    list_id: Option<i64>,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
) -> Result<Vec<ClaimRowPg>> {
    let now = now_ms();
    let (sql, mut binds) = match list_id {
        Some(list) => (&*CLAIM_PG_LIST, vec![Bind::Int(list)]),
        None => (&*CLAIM_PG_IDS, vec![]),
    };
    binds.extend([
        Bind::Ints(recipient_ids),
        Bind::Int(campaign_id),
        Bind::Int(token),
        Bind::Int(now + lease_ms),
        Bind::Int(now),
    ]);
    Ok(Prepared::new(sql, binds).load(c)?)
}

/// Complete a claim: when it did not get every one of `recipient_ids`
/// (rare), say how many are finished and until when the others are held.
fn settle(
    conn: &mut Conn,
    mut claim: Claim,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
) -> Result<Claim> {
    claim.owned.sort_unstable();
    if claim.owned.len() == recipient_ids.len() {
        return Ok(claim);
    }
    // Ask which: some are finished or held by another worker.
    let now = now_ms();
    let rows: Vec<ClaimRow> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::recipient_id.eq_any(recipient_ids))
        .select((
            d::recipient_id,
            d::state,
            d::claim_token,
            d::claimed_until,
            d::attempts
        ))
        .load(c))?;
    for (rid, state, owner, claimed_until, attempts) in rows {
        match state {
            // Already ours from an earlier call with this token.
            DeliveryState::Claimed if owner == Some(token) => {
                if !claim.owned.iter().any(|&(r, _)| r == rid) {
                    claim.owned.push((rid, attempts));
                }
            }
            DeliveryState::Claimed | DeliveryState::Retry => {
                let until = claimed_until.unwrap_or(now).max(now);
                claim.busy_until = Some(claim.busy_until.map_or(until, |b| b.max(until)));
            }
            _ => claim.finished += 1,
        }
    }
    Ok(claim)
}

/// Push back the lease on everything `token` still holds (a long job).
pub fn extend_claims(
    conn: &mut Conn,
    campaign_id: i64,
    token: i64,
    lease_ms: i64,
) -> Result<usize> {
    let until = now_ms() + lease_ms;
    Ok(on!(conn, |c| diesel::update(
        d::table
            .filter(d::campaign_id.eq(campaign_id))
            .filter(d::claim_token.eq(Some(token)))
            .filter(d::state.eq(DeliveryState::Claimed))
    )
    .set(d::claimed_until.eq(Some(until)))
    .execute(c))?)
}

/// What happened to one claimed recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutcomeKind {
    /// The relay accepted it (2xx).
    Sent,
    /// Permanent failure (5xx, bad address): never retried.
    Failed(String),
    /// Permanent failure whose enhanced status code says the address is bad
    /// (5.1.x): failed, and the recipient becomes `bounced` for every
    /// campaign (a hard bounce at send time).
    Bounced(String),
    /// Transient failure (4xx, timeout, lost connection): retried until the
    /// attempt limit, then failed.
    Retry(String),
    /// Not mailable any more (unsubscribed, bounced).
    Skipped(String),
    /// Handed back unsent (campaign paused or worker stopping); the attempt
    /// does not count.
    Unclaim,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub campaign_id: i64,
    pub recipient_id: i64,
    pub token: i64,
    pub kind: OutcomeKind,
}

/// What recording an outcome did to the ledger row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Now `sent`, `failed` or `skipped`.
    Final,
    /// Claimable again (retry later, or handed back).
    Open,
    /// The claim had expired and someone else holds the row now.
    Lost,
}

/// Per-campaign counter deltas gathered while recording a batch.
#[derive(Default)]
struct Delta {
    sent: i64,
    failed: i64,
    skipped: i64,
    /// Failures after the batch's last success, for auto-pause.
    trailing: i64,
    /// The batch's last failure reply, for the auto-pause reason.
    last_error: Option<String>,
}

/// What recording a batch of outcomes did.
#[derive(Debug)]
pub struct Recording {
    /// One per outcome, in order.
    pub results: Vec<Recorded>,
    /// Campaigns this batch's failures paused (see [`autopause`]).
    pub paused: Vec<i64>,
}

/// Record a batch of outcomes in one transaction and move the counters by
/// the rows actually changed. `max_attempts` turns a transient failure on the
/// last attempt into `failed`. Returns one [`Recorded`] per outcome.
pub fn record(conn: &mut Conn, outcomes: &[Outcome], max_attempts: i32) -> Result<Vec<Recorded>> {
    record_batch(conn, outcomes, max_attempts).map(|r| r.results)
}

/// [`record`], also saying which campaigns the batch auto-paused, so that
/// its worker stops sending for them at once.
pub fn record_batch(conn: &mut Conn, outcomes: &[Outcome], max_attempts: i32) -> Result<Recording> {
    let now = now_ms();
    if outcomes.iter().all(|o| o.kind == OutcomeKind::Sent) {
        if let InnerMut::Pg(c) = conn.inner_mut() {
            return Ok(Recording {
                results: record_sent_pg(c, outcomes, now)?,
                paused: Vec::new(),
            });
        }
    }
    conn.transaction(|conn| {
        let mut results = vec![Recorded::Lost; outcomes.len()];
        let mut deltas: BTreeMap<i64, Delta> = BTreeMap::new();

        // Successes are the bulk: one UPDATE per (campaign, token).
        let mut sent: BTreeMap<(i64, i64), Vec<usize>> = BTreeMap::new();
        for (i, o) in outcomes.iter().enumerate() {
            if o.kind == OutcomeKind::Sent {
                sent.entry((o.campaign_id, o.token)).or_default().push(i);
            }
        }
        for ((campaign_id, token), idx) in sent {
            let ids: Vec<i64> = idx.iter().map(|&i| outcomes[i].recipient_id).collect();
            // RETURNING tells exactly which rows this claim still held.
            let done: Vec<i64> = on!(conn, |c| diesel::update(owned_rows!(
                campaign_id,
                token,
                &ids
            ))
            .set((
                d::state.eq(DeliveryState::Sent),
                d::claim_token.eq(None::<i64>),
                d::last_error.eq(None::<String>),
                d::updated_at.eq(now),
            ))
            .returning(d::recipient_id)
            .get_results(c))?;
            deltas.entry(campaign_id).or_default().sent += done.len() as i64;
            for &i in &idx {
                let ours = done.len() == ids.len() || done.contains(&outcomes[i].recipient_id);
                results[i] = if ours {
                    Recorded::Final
                } else {
                    Recorded::Lost
                };
            }
        }

        for (i, o) in outcomes.iter().enumerate() {
            let ids = std::slice::from_ref(&o.recipient_id);
            let mine = || owned_rows!(o.campaign_id, o.token, ids);
            // Close this claim with a state and the relay's reply; 1 if it
            // was still ours.
            let close = |conn: &mut Conn, state: DeliveryState, err: &str, last_try: bool| {
                let set = (
                    d::state.eq(state),
                    d::claim_token.eq(None::<i64>),
                    d::last_error.eq(Some(err)),
                    d::updated_at.eq(now),
                );
                Ok::<_, StoreError>(if last_try {
                    on!(conn, |c| diesel::update(
                        mine().filter(d::attempts.ge(max_attempts))
                    )
                    .set(set)
                    .execute(c))?
                } else {
                    on!(conn, |c| diesel::update(mine()).set(set).execute(c))?
                })
            };
            let delta = deltas.entry(o.campaign_id).or_default();
            let (state, changed) = match &o.kind {
                OutcomeKind::Sent => continue,
                OutcomeKind::Failed(err) => {
                    let n = close(conn, DeliveryState::Failed, err, false)?;
                    delta.failed += n as i64;
                    (Recorded::Final, n)
                }
                OutcomeKind::Bounced(err) => {
                    let n = close(conn, DeliveryState::Failed, err, false)?;
                    delta.failed += n as i64;
                    if n == 1 {
                        hard_bounce(conn, o.campaign_id, o.recipient_id, err)?;
                    }
                    (Recorded::Final, n)
                }
                OutcomeKind::Skipped(err) => {
                    let n = close(conn, DeliveryState::Skipped, err, false)?;
                    delta.skipped += n as i64;
                    (Recorded::Final, n)
                }
                // A transient failure on the last allowed attempt is final.
                OutcomeKind::Retry(err) => match close(conn, DeliveryState::Failed, err, true)? {
                    0 => (
                        Recorded::Open,
                        close(conn, DeliveryState::Retry, err, false)?,
                    ),
                    n => {
                        delta.failed += n as i64;
                        (Recorded::Final, n)
                    }
                },
                OutcomeKind::Unclaim => {
                    let n = on!(conn, |c| diesel::update(mine())
                        .set((
                            d::state.eq(DeliveryState::Retry),
                            d::attempts.eq(d::attempts - 1),
                            d::claim_token.eq(None::<i64>),
                            d::updated_at.eq(now),
                        ))
                        .execute(c))?;
                    (Recorded::Open, n)
                }
            };
            results[i] = if changed == 1 { state } else { Recorded::Lost };
        }

        // Failures after each campaign's last success in this batch, in the
        // order the outcomes came (for the auto-pause streak).
        for (o, result) in outcomes.iter().zip(&results) {
            let delta = deltas.entry(o.campaign_id).or_default();
            match (&o.kind, result) {
                (OutcomeKind::Sent, Recorded::Final) => delta.trailing = 0,
                (
                    OutcomeKind::Failed(e) | OutcomeKind::Bounced(e) | OutcomeKind::Retry(e),
                    Recorded::Final,
                ) => {
                    delta.trailing += 1;
                    delta.last_error = Some(e.clone());
                }
                _ => {}
            }
        }
        let mut paused = Vec::new();
        for (campaign_id, delta) in deltas {
            if delta.sent + delta.failed + delta.skipped > 0 {
                bump_counters(conn, campaign_id, &delta, now)?;
            }
            if delta.failed > 0 {
                if let Some(reason) =
                    autopause::check(conn, campaign_id, delta.last_error.as_deref(), now)?
                {
                    tracing::warn!(campaign = campaign_id, "{reason}");
                    paused.push(campaign_id);
                }
            }
        }
        Ok(Recording { results, paused })
    })
}

/// Move the counters and, every [`RATE_WINDOW_MS`], the observed rate, in
/// one statement (diesel prepares every UPDATE afresh, so one per batch, not
/// three).
fn bump_counters(conn: &mut Conn, campaign_id: i64, delta: &Delta, now: i64) -> Result<()> {
    let set = counters_set(
        &delta.sent.to_string(),
        &delta.failed.to_string(),
        &delta.skipped.to_string(),
        &delta.trailing.to_string(),
        &now.to_string(),
    );
    conn.execute_batch(&format!(
        "UPDATE campaign_counters SET {set} WHERE campaign_id = {campaign_id}"
    ))
}

/// The `SET` clauses of the counters UPDATE for a batch that adds `sent`,
/// `failed` and `skipped` outcomes, `trailing` failures after its last
/// success, at time `now`. Each figure is an SQL expression: an integer, or
/// a value the same statement binds or computes (see [`record_sent_pg`]);
/// nothing from outside is formatted in, so no injection is possible, and
/// the arithmetic reads the same on both backends. In an UPDATE every
/// right-hand side reads the row as it was, so the new total is spelled out
/// as the old one plus this batch.
fn counters_set(sent: &str, failed: &str, skipped: &str, trailing: &str, now: &str) -> String {
    let added = format!("({sent} + {failed} + {skipped})");
    let due = format!("(window_at = 0 OR window_at <= {now} - {RATE_WINDOW_MS})");
    let failures = autopause::counter_sql(sent, failed, trailing);
    format!(
        "sent = sent + {sent}, failed = failed + {failed}, skipped = skipped + {skipped}, \
         first_at = COALESCE(first_at, {now}), last_at = {now}, \
         rate = CASE WHEN {due} AND window_at > 0 \
           THEN (sent + failed + skipped + {added} - window_done) * 1000.0 / ({now} - window_at) \
           ELSE rate END, \
         window_done = CASE WHEN {due} THEN sent + failed + skipped + {added} ELSE window_done END, \
         window_at = CASE WHEN {due} THEN {now} ELSE window_at END, \
         {failures}"
    )
}

/// The statement of [`record_sent_pg`]: one text for every batch, so each
/// connection prepares it once (see [`super::prepared`]).
static RECORD_SENT_PG: LazyLock<String> = LazyLock::new(|| {
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
           SET state = '{sent}', claim_token = NULL, last_error = NULL, updated_at = p.now \
           FROM p, unnest(?::bigint[], ?::bigint[], ?::bigint[]) AS o(cid, rid, tok) \
           WHERE d.campaign_id = o.cid AND d.recipient_id = o.rid \
             AND d.claim_token = o.tok AND d.state = '{claimed}' \
           RETURNING d.recipient_id AS rid, o.tok AS tok), \
         n AS (SELECT count(*) AS k FROM done), \
         bump AS (UPDATE campaign_counters SET {set} \
           FROM n, p WHERE campaign_id = p.campaign AND n.k > 0) \
         SELECT rid, tok FROM done"
    )
});

/// PostgreSQL, a batch of successes only (nearly every batch): for each
/// campaign, one statement marks `sent` the rows still claimed by their
/// outcome's token and moves the counters by the rows it marked. A
/// statement is atomic by itself, so there is no BEGIN and COMMIT: one
/// round trip instead of four, and the counters row is locked for the
/// statement alone, not across round trips up to a COMMIT (what bound
/// workers a LAN hop away from the database).
fn record_sent_pg(
    c: &mut diesel::pg::PgConnection,
    outcomes: &[Outcome],
    now: i64,
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
        let marked: Vec<Marked> = Prepared::new(
            &RECORD_SENT_PG,
            vec![
                Bind::Int(now),
                Bind::Int(campaign_id),
                Bind::Ints(&cids),
                Bind::Ints(&rids),
                Bind::Ints(&toks),
            ],
        )
        .load(c)?;
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

/// A 5.1.x refusal at send time: the address is bad for every campaign.
/// Recorded as a hard bounce event (once per campaign and recipient) that
/// marks the delivery, moves the `bounced` counter and makes the recipient
/// `bounced`, in the caller's transaction.
fn hard_bounce(conn: &mut Conn, campaign_id: i64, recipient_id: i64, reply: &str) -> Result<()> {
    let email: Option<String> = on!(conn, |c| recipients::table
        .find(recipient_id)
        .select(recipients::email)
        .first(c)
        .optional())?;
    let Some(email) = email else {
        return Ok(());
    };
    let status = reply
        .split_whitespace()
        .nth(1)
        .filter(|w| w.starts_with("5."));
    bounces::record(
        conn,
        &bounces::NewBounce {
            recipient_id,
            campaign_id: Some(campaign_id),
            email: &email,
            kind: bounces::BounceKind::Hard,
            status,
            reason: reply,
            source: bounces::BounceSource::Smtp,
            fingerprint: &format!("smtp:{campaign_id}"),
        },
        &bounces::Action::Bounce(format!("hard bounce at send time: {reply}")),
    )?;
    Ok(())
}

/// How often the observed send rate is recomputed.
pub const RATE_WINDOW_MS: i64 = 5_000;

/// The recipients in `(after, upto]` the ledger has a row for, in id order
/// (an enqueue window: at most a page of the list).
pub fn recipients_in_range(
    conn: &mut Conn,
    campaign_id: i64,
    after: i64,
    upto: i64,
) -> Result<Vec<i64>> {
    Ok(on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::recipient_id.gt(after))
        .filter(d::recipient_id.le(upto))
        .order(d::recipient_id)
        .select(d::recipient_id)
        .load(c))?)
}

/// `COUNT(*)` of the ledger by state: what the counters must always equal.
pub fn ledger_counts(conn: &mut Conn, campaign_id: i64) -> Result<BTreeMap<DeliveryState, i64>> {
    let rows: Vec<(DeliveryState, i64)> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .group_by(d::state)
        .select((d::state, diesel::dsl::count_star()))
        .load(c))?;
    Ok(rows.into_iter().collect())
}

/// Failed recipients of a campaign with the relay's reply, oldest first.
pub fn failures(conn: &mut Conn, campaign_id: i64, limit: i64) -> Result<Vec<(i64, String)>> {
    let rows: Vec<(i64, Option<String>)> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::state.eq(DeliveryState::Failed))
        .order(d::updated_at)
        .select((d::recipient_id, d::last_error))
        .limit(limit)
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(rid, e)| (rid, e.unwrap_or_default()))
        .collect())
}

/// Of `recipient_ids`, those whose delivery in the campaign is final
/// (`sent`, `failed` or `skipped`): what `requeue` leaves out.
pub fn finished_among(
    conn: &mut Conn,
    campaign_id: i64,
    recipient_ids: &[i64],
) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for ids in recipient_ids.chunks(SQLITE_CHUNK) {
        out.extend(on!(conn, |c| d::table
            .filter(d::campaign_id.eq(campaign_id))
            .filter(d::recipient_id.eq_any(ids))
            .filter(d::state.eq_any([
                DeliveryState::Sent,
                DeliveryState::Failed,
                DeliveryState::Skipped
            ]))
            .select(d::recipient_id)
            .load::<i64>(c))?);
    }
    Ok(out)
}

/// Make a campaign's failed deliveries to recipients who are still active
/// claimable again (`requeue --failed`), with fresh attempts, and take them
/// out of the `failed` counter in the same transaction. A recipient whose
/// address bounced, or who unsubscribed, stays failed. Returns how many.
pub fn reopen_failed(conn: &mut Conn, campaign_id: i64) -> Result<i64> {
    use super::schema::campaign_counters as cc;
    let now = now_ms();
    conn.transaction(|conn| {
        let active = recipients::table
            .filter(recipients::status.eq(super::RecipientStatus::Active))
            .select(recipients::id);
        let n = on!(conn, |c| diesel::update(
            d::table
                .filter(d::campaign_id.eq(campaign_id))
                .filter(d::state.eq(DeliveryState::Failed))
                .filter(d::recipient_id.eq_any(active))
        )
        .set((
            d::state.eq(DeliveryState::Retry),
            d::attempts.eq(0),
            d::claim_token.eq(None::<i64>),
            d::updated_at.eq(now),
        ))
        .execute(c))? as i64;
        if n > 0 {
            on!(conn, |c| diesel::update(cc::table.find(campaign_id))
                .set(cc::failed.eq(cc::failed - n))
                .execute(c))?;
        }
        Ok(n)
    })
}
