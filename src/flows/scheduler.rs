//! The flow scheduler every worker runs: once a tick it tries to take
//! (or renew) the one database lease; the holder reads the entries due
//! (the `due_at` index, oldest first, a batch at a time), checks at due
//! time that the member may still get mail, submits the step as a
//! message under its idempotency key and moves the entry to its next
//! step. A holder killed with -9 stops renewing; another worker takes the
//! lease once it lapses. Two holders at once (a stalled one whose lease
//! lapsed) cannot send a step twice: the key makes one message, and the
//! entry moves on a conditional UPDATE. The holder also sweeps for
//! messages whose jobs were lost (see [`crate::messages::sweep`]), every
//! half grace period. A step's messages travel in the flows' band
//! ([`Band::Flow`]), behind every transactional message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::FlowError;
use crate::messages::sweep::{self, SweepError, FLOW_KEY_PREFIX};
use crate::messages::{self, MessageError, Queue, Submit};
use crate::queue::message::{Band, MAX_BATCH};
use crate::store::flows::{self as store, Flow, Step, Trigger};
use crate::store::messages::MessageStatus;
use crate::store::{messages_sweep, now_ms, Conn, Db, StoreError};
use crate::tokens::Identity;

/// How often a worker looks for due steps (or tries the lease), unless
/// the hidden `MAILSPLIT_FLOW_TICK_MS` (at least 100) says otherwise.
pub const TICK: Duration = Duration::from_secs(1);
/// Entries read per batch.
const BATCH: i64 = 200;
/// A step whose message could not be queued is tried again after this.
const RETRY_MS: i64 = 10_000;

fn tick() -> Duration {
    std::env::var("MAILSPLIT_FLOW_TICK_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms >= 100)
        .map_or(TICK, Duration::from_millis)
}

/// The idempotency key of entry `entry`'s step `step` of flow `flow`.
pub fn step_key(flow: i64, entry: i64, step: i64) -> String {
    format!("{FLOW_KEY_PREFIX}{flow}:{entry}:{step}")
}

/// Schedule until `stop`, then give the lease up.
pub async fn run(db: Arc<Db>, queue: Queue, stop: CancellationToken) {
    let owner = format!(
        "{}:{}:{:08x}",
        crate::config::host_name(),
        std::process::id(),
        rand::random::<u32>()
    );
    // The lease is the jobs' lease (MAILSPLIT_LEASE_MS shortens both).
    let lease_ms = crate::queue::job_ttr().as_millis() as i64;
    let mut ticks = tokio::time::interval(tick());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let queue = Arc::new(queue);
    let mut holding = false;
    let mut next_sweep = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        match round(&db, &queue, &owner, lease_ms, &stop).await {
            Ok(held) => {
                if held && !holding {
                    tracing::info!(owner = %owner, "flow scheduler: this worker holds the lease");
                    // Not at once: workers starting together (a deploy)
                    // are reserving and claiming the jobs that waited.
                    next_sweep = tokio::time::Instant::now() + sweep::every();
                } else if !held && holding {
                    tracing::info!(owner = %owner, "flow scheduler: lease passed to another worker");
                }
                holding = held;
            }
            Err(e) => tracing::warn!(error = %e, "flow scheduler: trying again"),
        }
        if holding && tokio::time::Instant::now() >= next_sweep && !stop.is_cancelled() {
            next_sweep = tokio::time::Instant::now() + sweep::every();
            if let Err(e) = sweep_lost(&db, &queue, &owner, lease_ms, &stop).await {
                tracing::warn!(error = %e, "message sweep: trying again at the next");
            }
        }
    }
    let me = owner.clone();
    if let Err(e) = db.run(move |c| store::release(c, &me)).await {
        tracing::debug!(error = %e, "cannot release the flow lease (it expires)");
    }
}

/// One tick: the lease, then due batches while the lease is ours.
async fn round(
    db: &Arc<Db>,
    queue: &Arc<Queue>,
    owner: &str,
    lease_ms: i64,
    stop: &CancellationToken,
) -> Result<bool, FlowError> {
    let mut first = true;
    loop {
        let now = now_ms();
        let me = owner.to_string();
        if !db
            .run(move |c| store::lease(c, &me, now, now + lease_ms))
            .await?
        {
            return Ok(false);
        }
        if first {
            // SQL triggers first: a due step then goes out on fresh rows.
            first = false;
            if let Err(e) = super::sql::poll_due(db).await {
                tracing::warn!(error = %e, "flow scheduler: cannot poll the SQL triggers");
            }
        }
        let q = Arc::clone(queue);
        let handled = db.run(move |c| Ok(batch(c, &q, now))).await??;
        if handled < BATCH as usize || stop.is_cancelled() {
            return Ok(true);
        }
    }
}

/// One sweep for lost message jobs (see [`sweep`]): a page at a time,
/// each after the lease is renewed, up to [`sweep::MAX_PAGES`]; one line
/// in the log when it put any.
async fn sweep_lost(
    db: &Arc<Db>,
    queue: &Arc<Queue>,
    owner: &str,
    lease_ms: i64,
    stop: &CancellationToken,
) -> Result<(), SweepError> {
    let started = now_ms();
    let q = Arc::clone(queue);
    let waited = tokio::task::spawn_blocking(move || sweep::queue_wait(&q))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    let Some(waited) = waited else {
        tracing::debug!("message sweep: a transactional job heads the queue; sweeping next time");
        return Ok(());
    };
    let before = started - (sweep::grace() + waited).as_millis() as i64;
    tracing::debug!(?waited, before, "message sweep");
    let mut put = 0;
    for _ in 0..sweep::MAX_PAGES {
        let now = now_ms();
        let me = owner.to_string();
        if !db
            .run(move |c| store::lease(c, &me, now, now + lease_ms))
            .await?
        {
            break;
        }
        let q = Arc::clone(queue);
        let page = db
            .run(move |c| Ok(sweep::page(c, &q, started, before)))
            .await??;
        put += page.put;
        if page.read < sweep::PAGE as usize || stop.is_cancelled() {
            break;
        }
    }
    if put > 0 {
        tracing::info!(put, "{put} messages put again: their jobs were lost");
    }
    Ok(())
}

/// One batch of due entries; how many were read. Three steps, so that a
/// batch costs a few transactions rather than a few per entry, and a job
/// never names a row not yet committed nor an entry moves on before its
/// job is put:
/// 1. one write transaction: entries that leave or end are moved, and
///    each due step is stored as a message under its idempotency key;
/// 2. after the commit, the messages' jobs, up to [`MAX_BATCH`] a job;
/// 3. one write transaction: each entry whose job was put moves to its
///    next step, and its message's next attempt is due from the put (a
///    batch takes a while to store; the sweep for lost jobs counts its
///    grace period from here); one whose job could not be put is tried
///    again later (its key finds the same message then, and puts its job
///    again).
pub fn batch(conn: &mut Conn, queue: &Queue, now: i64) -> Result<usize, FlowError> {
    let due = store::due(conn, now, BATCH)?;
    if due.is_empty() {
        return Ok(0);
    }
    let stored = conn.transaction(|c| store_steps(c, &due, now))?;
    let put = put_jobs(queue, &stored);
    let queued: Vec<i64> = stored
        .iter()
        .zip(&put)
        .filter(|(s, &put)| put && s.to_put.is_some())
        .map(|(s, _)| s.message)
        .collect();
    let put_at = now_ms();
    conn.transaction(|c| {
        messages_sweep::queued_at(c, &queued, put_at)?;
        for (s, put) in stored.iter().zip(put) {
            if put {
                store::advance(c, s.entry, s.step, s.step + 1, s.next_due)?;
            } else {
                store::postpone(c, s.entry, s.step, now + RETRY_MS)?;
            }
        }
        Ok::<_, FlowError>(())
    })?;
    Ok(due.len())
}

/// A due step stored as a message, its entry not yet moved on.
struct Stored {
    entry: i64,
    step: i64,
    /// When the entry's next step is due (none: it was the last).
    next_due: Option<i64>,
    message: i64,
    /// Whether its job is to be put, and the identity that signs it.
    to_put: Option<Identity>,
}

/// A batch's flows and their steps, read once per batch.
type Flows = HashMap<i64, Option<(Flow, Vec<Step>)>>;

/// Step 1 of [`batch`], inside its transaction.
fn store_steps(conn: &mut Conn, due: &[store::Due], now: i64) -> Result<Vec<Stored>, FlowError> {
    let mut flows: Flows = HashMap::new();
    let mut stored = Vec::with_capacity(due.len());
    for d in due {
        if let std::collections::hash_map::Entry::Vacant(slot) = flows.entry(d.flow_id) {
            let loaded = match store::by_id(conn, d.flow_id)? {
                Some(f) => {
                    let steps = store::steps(conn, f.id)?;
                    Some((f, steps))
                }
                None => None,
            };
            slot.insert(loaded);
        }
        let Some(Some((flow, steps))) = flows.get(&d.flow_id) else {
            continue;
        };
        if let Some(s) = store_step(conn, flow, steps, d, now)? {
            stored.push(s);
        }
    }
    Ok(stored)
}

/// Entry `d`'s due step: stored as a message, or the entry leaves, ends
/// or waits.
fn store_step(
    conn: &mut Conn,
    flow: &Flow,
    steps: &[Step],
    d: &store::Due,
    now: i64,
) -> Result<Option<Stored>, FlowError> {
    let Some(step) = steps.get(d.next_step as usize) else {
        store::advance(conn, d.id, d.next_step, d.next_step, None)?;
        return Ok(None);
    };
    if !may_go(conn, flow, d, step, now)? {
        return Ok(None);
    }
    let submit = Submit {
        template: step.template.clone(),
        to: to(&d.email, &d.name),
        data: Some(data_of(flow, d)),
        idempotency_key: Some(step_key(flow.id, d.id, d.next_step)),
    };
    match messages::submit::store(conn, submit, messages::AskedBy::Sender) {
        Ok(s) if s.submitted.status == MessageStatus::Suppressed => {
            store::leave(conn, d.id, d.next_step, "suppressed")?;
            Ok(None)
        }
        Ok(s) => {
            let next_due = steps
                .get(d.next_step as usize + 1)
                .map(|s| (d.entered_at + s.delay_ms).max(now));
            Ok(Some(Stored {
                entry: d.id,
                step: d.next_step,
                next_due,
                message: s.submitted.id,
                // Found again still queued (its job's put failed, or the
                // scheduler stopped before the entry moved on): put again.
                // Only one scheduler runs, so this is rare; a second job
                // is harmless.
                to_put: s.waiting.then_some(s.identity),
            }))
        }
        Err(MessageError::Refused(_)) => {
            store::leave(conn, d.id, d.next_step, "suppressed")?;
            Ok(None)
        }
        Err(MessageError::Store(e)) => Err(e.into()),
        Err(e) => {
            // Template removed, an address the wire refuses: said once
            // per try, tried again later.
            tracing::warn!(flow = %flow.name, entry = d.id, step = d.next_step, error = %e,
                "flow step not sent; trying again in 10 s");
            store::postpone(conn, d.id, d.next_step, now + RETRY_MS)?;
            Ok(None)
        }
    }
}

/// What entry `d`'s step templates see: a SQL trigger's row as `row`, a
/// join's member data as it is.
fn data_of(flow: &Flow, d: &store::Due) -> Value {
    let row: Value = serde_json::from_str(&d.row_data).unwrap_or(Value::Object(Default::default()));
    match flow.trigger_kind {
        Trigger::Sql => serde_json::json!({ "row": row }),
        Trigger::Join => row,
    }
}

/// Whether entry `d` may get its due `step` now; if not, it has left or
/// waits (moved here).
fn may_go(
    conn: &mut Conn,
    flow: &Flow,
    d: &store::Due,
    step: &Step,
    now: i64,
) -> Result<bool, FlowError> {
    if let Some(reason) = store::leave_reason(conn, d.recipient_id, d.status)? {
        store::leave(conn, d.id, d.next_step, reason)?;
        return Ok(false);
    }
    match flow.trigger_kind {
        Trigger::Sql => still_matched(conn, flow, d, step, now),
        Trigger::Join => {
            let member = match flow.list_id {
                Some(list) => store::is_member(conn, list, d.recipient_id)?,
                None => false,
            };
            if !member {
                store::leave(conn, d.id, d.next_step, "removed")?;
            }
            Ok(member)
        }
    }
}

/// Step 2 of [`batch`]: the stored messages' jobs, up to [`MAX_BATCH`]
/// messages a job; for each stored step, whether its job is on the queue
/// (a message not to put is: its job was put before).
fn put_jobs(queue: &Queue, stored: &[Stored]) -> Vec<bool> {
    let mut put = vec![true; stored.len()];
    let to_put: Vec<(usize, &Stored, &Identity)> = stored
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.to_put.as_ref().map(|id| (i, s, id)))
        .collect();
    for chunk in to_put.chunks(MAX_BATCH) {
        let ids: Vec<i64> = chunk.iter().map(|(_, s, _)| s.message).collect();
        let identity = chunk[0].2;
        if let Err(e) = messages::submit::put(queue, identity, &ids, Band::Flow) {
            tracing::warn!(error = %e, messages = ids.len(), "flow steps not queued; trying again in 10 s");
            for (i, _, _) in chunk {
                put[*i] = false;
            }
        }
    }
    put
}

/// Whether a SQL trigger's entry `d` may get its due `step`: the last
/// complete poll began after the step fell due (else it is tried again
/// later: the source may be down) and returned the entry's (email, key)
/// (else it leaves, `no longer matched`).
fn still_matched(
    conn: &mut Conn,
    flow: &Flow,
    d: &store::Due,
    step: &Step,
    now: i64,
) -> Result<bool, FlowError> {
    // Due by the step's own time, not by a retry's.
    if flow.matched_at < d.entered_at + step.delay_ms {
        store::postpone(conn, d.id, d.next_step, now + RETRY_MS)?;
        return Ok(false);
    }
    if d.seen_at < flow.matched_at {
        store::leave(conn, d.id, d.next_step, super::sql::NO_LONGER_MATCHED)?;
        return Ok(false);
    }
    Ok(true)
}

/// The recipient as `to`: with the name on file, so that `{{ name }}`
/// renders in the step as in a campaign.
fn to(email: &str, name: &str) -> String {
    let address = email.parse::<lettre::Address>();
    match address {
        Ok(a) if !name.trim().is_empty() => {
            lettre::message::Mailbox::new(Some(name.to_string()), a).to_string()
        }
        _ => email.to_string(),
    }
}
