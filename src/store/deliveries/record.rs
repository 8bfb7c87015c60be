//! Recording what became of claimed recipients: outcomes into the ledger
//! and the counters in one transaction, moved by the rows actually changed.

use super::pg_fast::record_sent_pg;
use super::*;
use crate::store::outbox::{self, EventKind};

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
            d::content_version.eq(version),
        ))
        .returning(d::recipient_id)
        .get_results(c))?;
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

/// One outcome that is not a success: what it makes of the row, and how
/// many rows it changed (1 when the claim was still ours).
fn record_other(
    conn: &mut Conn,
    o: &Outcome,
    now: i64,
    max_attempts: i32,
    delta: &mut Delta,
) -> Result<(Recorded, usize)> {
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
    Ok(match &o.kind {
        OutcomeKind::Sent => (Recorded::Final, 1),
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
    })
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

/// A gap between two outcomes longer than this is idle time (a pause), left
/// out of the rate: [`crate::status`] shows no rate after this long without
/// an outcome either.
pub fn idle_gap_ms() -> i64 {
    2 * super::rate_window_ms()
}

/// Move the counters and, every [`super::rate_window_ms`], the observed rate, in
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
pub(super) fn counters_set(
    sent: &str,
    failed: &str,
    skipped: &str,
    trailing: &str,
    now: &str,
) -> String {
    let added = format!("({sent} + {failed} + {skipped})");
    // A stretch without outcomes longer than idle_gap_ms() (a pause, an
    // empty queue) is not sending time: the window's start moves past it,
    // so the rate after a resume counts only time spent sending.
    let (idle, window) = (idle_gap_ms(), super::rate_window_ms());
    let gap = format!(
        "(CASE WHEN last_at IS NOT NULL AND {now} - last_at > {idle} \
          THEN {now} - last_at ELSE 0 END)"
    );
    let start = format!("(window_at + {gap})");
    let due = format!("(window_at = 0 OR {start} <= {now} - {window})");
    let failures = autopause::counter_sql(sent, failed, trailing);
    format!(
        "sent = sent + {sent}, failed = failed + {failed}, skipped = skipped + {skipped}, \
         first_at = COALESCE(first_at, {now}), last_at = {now}, \
         rate = CASE WHEN {due} AND window_at > 0 \
           THEN (sent + failed + skipped + {added} - window_done) * 1000.0 / ({now} - {start}) \
           ELSE rate END, \
         window_done = CASE WHEN {due} THEN sent + failed + skipped + {added} ELSE window_done END, \
         window_at = CASE WHEN {due} THEN {now} WHEN window_at = 0 THEN 0 ELSE {start} END, \
         {failures}"
    )
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
