//! Recording what became of claimed recipients: outcomes into the ledger
//! and the counters in one transaction, moved by the rows actually changed.

use diesel::connection::SimpleConnection;
use std::sync::LazyLock;

use super::counters::{bump_counters, Delta};
use super::pg_fast::record_sent_pg;
use super::*;
use crate::store::outbox::{self, EventKind};
use crate::store::prepared::ids_json;

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
    /// The content version of the message sent (recorded with `sent`;
    /// `None`: not known, as for messages of campaigns without content).
    pub content_version: Option<i64>,
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
    if outcomes.iter().all(|o| o.kind == OutcomeKind::Sent) && conn.backend() == Backend::Postgres {
        // Who wants `sent` events: the connection's copy, no query.
        let hooks = outbox::subscribers(conn, EventKind::Sent)?;
        if let InnerMut::Pg(c) = conn.inner_mut() {
            return Ok(Recording {
                results: record_sent_pg(c, outcomes, now, &hooks)?,
                paused: Vec::new(),
            });
        }
    }
    conn.transaction(|conn| {
        let mut results = vec![Recorded::Lost; outcomes.len()];
        let mut deltas: BTreeMap<i64, Delta> = BTreeMap::new();
        record_successes(conn, outcomes, now, &mut results, &mut deltas)?;
        for (i, o) in outcomes.iter().enumerate() {
            if o.kind == OutcomeKind::Sent {
                continue;
            }
            let delta = deltas.entry(o.campaign_id).or_default();
            let failed_before = delta.failed;
            let (state, changed) = record_other(conn, o, now, max_attempts, delta)?;
            results[i] = if changed == 1 { state } else { Recorded::Lost };
            if delta.failed > failed_before {
                let rid = [o.recipient_id];
                outbox::record_recipients(conn, EventKind::Failed, o.campaign_id, &rid, now)?;
            }
        }
        count_trailing(outcomes, &results, &mut deltas);
        let paused = apply_deltas(conn, deltas, now)?;
        Ok(Recording { results, paused })
    })
}

/// Successes are the bulk: one UPDATE per (campaign, token), whose
/// RETURNING tells exactly which rows this claim still held.
fn record_successes(
    conn: &mut Conn,
    outcomes: &[Outcome],
    now: i64,
    results: &mut [Recorded],
    deltas: &mut BTreeMap<i64, Delta>,
) -> Result<()> {
    let mut sent: BTreeMap<(i64, i64, Option<i64>), Vec<usize>> = BTreeMap::new();
    for (i, o) in outcomes.iter().enumerate() {
        if o.kind == OutcomeKind::Sent {
            let key = (o.campaign_id, o.token, o.content_version);
            sent.entry(key).or_default().push(i);
        }
    }
    for ((campaign_id, token, version), idx) in sent {
        let ids: Vec<i64> = idx.iter().map(|&i| outcomes[i].recipient_id).collect();
        let done = mark_sent(conn, campaign_id, token, version, &ids, now)?;
        deltas.entry(campaign_id).or_default().sent += done.len() as i64;
        outbox::record_recipients(conn, EventKind::Sent, campaign_id, &done, now)?;
        for &i in &idx {
            let ours = done.len() == ids.len() || done.contains(&outcomes[i].recipient_id);
            results[i] = if ours {
                Recorded::Final
            } else {
                Recorded::Lost
            };
        }
    }
    Ok(())
}

/// Mark `ids` sent where this claim (`token`) still holds them; the ids
/// marked. On SQLite see [`mark_sent_sqlite`].
fn mark_sent(
    conn: &mut Conn,
    campaign_id: i64,
    token: i64,
    version: Option<i64>,
    ids: &[i64],
    now: i64,
) -> Result<Vec<i64>> {
    match conn.inner_mut() {
        InnerMut::Sqlite(c) => {
            let ids_json = ids_json(ids);
            let binds = || {
                vec![
                    Bind::Int(now),
                    Bind::OptInt(version),
                    Bind::Int(campaign_id),
                    Bind::Int(token),
                    Bind::Json(&ids_json),
                ]
            };
            mark_sent_sqlite(c, binds, ids)
        }
        InnerMut::Pg(c) => Ok(diesel::update(owned_rows!(campaign_id, token, ids))
            .set((
                d::state.eq(DeliveryState::Sent),
                d::claim_token.eq(None::<i64>),
                d::last_error.eq(None::<String>),
                d::updated_at.eq(now),
                d::content_version.eq(version),
            ))
            .returning(d::recipient_id)
            .get_results(c)?),
    }
}

/// [`mark_sent`] on SQLite: fixed statements (prepared once per
/// connection, the ids as one JSON array), where diesel's UPDATE would be
/// parsed anew for every batch; and first without RETURNING, whose rows
/// SQLite keeps aside and hands back one by one (a third of the UPDATE's
/// cost): when it changed as many rows as there are ids, every one was
/// ours. Otherwise (a claim taken over, an id twice) it is undone (a
/// savepoint) and done again with RETURNING, which says which.
fn mark_sent_sqlite<'a>(
    c: &mut diesel::sqlite::SqliteConnection,
    binds: impl Fn() -> Vec<Bind<'a>>,
    ids: &[i64],
) -> Result<Vec<i64>> {
    #[derive(QueryableByName)]
    struct Marked {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        rid: i64,
    }
    const UNDO: &str = "ROLLBACK TO mark_sent; RELEASE mark_sent";
    c.batch_execute("SAVEPOINT mark_sent")?;
    match Prepared::new(&MARK_SENT_SQLITE, binds()).execute(c) {
        Ok(changed) if changed == ids.len() => {
            c.batch_execute("RELEASE mark_sent")?;
            return Ok(ids.to_vec());
        }
        Ok(_) => c.batch_execute(UNDO)?,
        Err(e) => {
            let _ = c.batch_execute(UNDO);
            return Err(e.into());
        }
    }
    let marked: Vec<Marked> = Prepared::new(&MARK_SENT_SQLITE_RETURNING, binds()).load(c)?;
    Ok(marked.into_iter().map(|m| m.rid).collect())
}

/// [`mark_sent_sqlite`]'s statements.
static MARK_SENT_SQLITE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE deliveries SET state = '{sent}', claim_token = NULL, last_error = NULL, \
           updated_at = ?, content_version = ? \
         WHERE campaign_id = ? AND claim_token = ? AND state = '{claimed}' \
           AND recipient_id IN (SELECT value FROM json_each(?))",
        sent = DeliveryState::Sent.as_str(),
        claimed = DeliveryState::Claimed.as_str()
    )
});
static MARK_SENT_SQLITE_RETURNING: LazyLock<String> =
    LazyLock::new(|| format!("{} RETURNING recipient_id AS rid", *MARK_SENT_SQLITE));

/// One outcome that is not a success: what it makes of the row, and how
/// many rows it changed (1 when the claim was still ours).
fn record_other(
    conn: &mut Conn,
    o: &Outcome,
    now: i64,
    max_attempts: i32,
    delta: &mut Delta,
) -> Result<(Recorded, usize)> {
    Ok(match &o.kind {
        OutcomeKind::Sent => (Recorded::Final, 1),
        OutcomeKind::Failed(err) => {
            let n = close_claim(conn, o, now, DeliveryState::Failed, err, None)?;
            delta.failed += n as i64;
            (Recorded::Final, n)
        }
        OutcomeKind::Bounced(err) => {
            let n = close_claim(conn, o, now, DeliveryState::Failed, err, None)?;
            delta.failed += n as i64;
            if n == 1 {
                hard_bounce(conn, o.campaign_id, o.recipient_id, err)?;
            }
            (Recorded::Final, n)
        }
        OutcomeKind::Skipped(err) => {
            let n = close_claim(conn, o, now, DeliveryState::Skipped, err, None)?;
            delta.skipped += n as i64;
            (Recorded::Final, n)
        }
        // A transient failure on the last allowed attempt is final.
        OutcomeKind::Retry(err) => {
            let last = Some(max_attempts);
            match close_claim(conn, o, now, DeliveryState::Failed, err, last)? {
                0 => (
                    Recorded::Open,
                    close_claim(conn, o, now, DeliveryState::Retry, err, None)?,
                ),
                n => {
                    delta.failed += n as i64;
                    (Recorded::Final, n)
                }
            }
        }
        OutcomeKind::Unclaim => (Recorded::Open, unclaim(conn, o, now)?),
    })
}

/// Close `o`'s claim with `state` and the relay's reply `err`, when it is
/// still ours (and, with `attempts_at_least`, the row has had that many
/// tries); the rows changed, 0 or 1.
fn close_claim(
    conn: &mut Conn,
    o: &Outcome,
    now: i64,
    state: DeliveryState,
    err: &str,
    attempts_at_least: Option<i32>,
) -> Result<usize> {
    let ids = std::slice::from_ref(&o.recipient_id);
    let mine = || owned_rows!(o.campaign_id, o.token, ids);
    let set = (
        d::state.eq(state),
        d::claim_token.eq(None::<i64>),
        d::last_error.eq(Some(err)),
        d::updated_at.eq(now),
    );
    Ok(match attempts_at_least {
        Some(min) => on!(conn, |c| diesel::update(mine().filter(d::attempts.ge(min)))
            .set(set)
            .execute(c))?,
        None => on!(conn, |c| diesel::update(mine()).set(set).execute(c))?,
    })
}

/// Hand `o`'s recipient back unsent, the attempt not counted; the rows
/// changed, 0 or 1.
fn unclaim(conn: &mut Conn, o: &Outcome, now: i64) -> Result<usize> {
    let ids = std::slice::from_ref(&o.recipient_id);
    Ok(on!(conn, |c| diesel::update(owned_rows!(
        o.campaign_id,
        o.token,
        ids
    ))
    .set((
        d::state.eq(DeliveryState::Retry),
        d::attempts.eq(d::attempts - 1),
        d::claim_token.eq(None::<i64>),
        d::updated_at.eq(now),
    ))
    .execute(c))?)
}

/// Failures after each campaign's last success in this batch, in the
/// order the outcomes came (for the auto-pause streak).
fn count_trailing(outcomes: &[Outcome], results: &[Recorded], deltas: &mut BTreeMap<i64, Delta>) {
    for (o, result) in outcomes.iter().zip(results) {
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
}

/// Move each campaign's counters by its delta and check its auto-pause;
/// returns the campaigns paused.
fn apply_deltas(conn: &mut Conn, deltas: BTreeMap<i64, Delta>, now: i64) -> Result<Vec<i64>> {
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
    Ok(paused)
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
