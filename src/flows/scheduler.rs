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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::FlowError;
use crate::messages::sweep::{self, Suspects, Sweep, SweepError, FLOW_KEY_PREFIX};
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
    let mut suspects = Suspects::default();
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
                    suspects = Suspects::default();
                }
                holding = held;
            }
            Err(e) => tracing::warn!(error = %e, "flow scheduler: trying again"),
        }
        if holding && tokio::time::Instant::now() >= next_sweep && !stop.is_cancelled() {
            next_sweep = tokio::time::Instant::now() + sweep::every();
            if let Err(e) = sweep_lost(&db, &queue, &owner, lease_ms, &stop, &mut suspects).await {
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
/// each after the lease is renewed; `suspects` are the last sweep's, and
/// become this one's (none when it stops early). One line in the log
/// when it put any.
async fn sweep_lost(
    db: &Arc<Db>,
    queue: &Arc<Queue>,
    owner: &str,
    lease_ms: i64,
    stop: &CancellationToken,
    suspects: &mut Suspects,
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
    tracing::debug!(?waited, before, suspects = suspects.len(), "message sweep");
    let mut pass = Sweep::new(std::mem::take(suspects), started, before);
    loop {
        let now = now_ms();
        let me = owner.to_string();
        if !db
            .run(move |c| store::lease(c, &me, now, now + lease_ms))
            .await?
        {
            return Ok(());
        }
        let q = Arc::clone(queue);
        let (back, more) = db
            .run(move |c| {
                let more = pass.step(c, &q);
                Ok((pass, more))
            })
            .await?;
        pass = back;
        if !more? || stop.is_cancelled() {
            break;
        }
    }
    let put = pass.put;
    *suspects = pass.suspects();
    if put > 0 {
        tracing::info!(put, "{put} messages put again: their jobs were lost");
    }
    Ok(())
}

/// One batch of due entries; how many were read. Four steps, so that a
/// batch costs a few statements and a short write lock rather than a few
/// statements per entry under the lock (the workers' claims and records
/// wait on SQLite's one writer), and a job never names a row not yet
/// committed nor an entry moves on before its job is put:
/// 1. one read transaction: for each entry, whether it still may get its
///    step (membership, complaints, the SQL trigger's last poll) and what
///    its message needs (template, suppressions), read for the batch;
/// 2. one write transaction: entries that leave, end or wait are moved,
///    and each due step is stored as a message under its idempotency key;
/// 3. after the commit, the messages' jobs, up to [`MAX_BATCH`] a job;
/// 4. one write transaction: each entry whose job was put moves to its
///    next step, and its message's next attempt is due from the put (a
///    batch takes a while to store; the sweep for lost jobs counts its
///    grace period from here); one whose job could not be put is tried
///    again later (its key finds the same message then, and puts its job
///    again).
///
/// What was read in step 1 may have changed by step 2 (a member who
/// unsubscribed meanwhile): the worker checks the suppressions again
/// when it claims the message, as for every message.
pub fn batch(conn: &mut Conn, queue: &Queue, now: i64) -> Result<usize, FlowError> {
    let due = store::due(conn, now, BATCH)?;
    if due.is_empty() {
        return Ok(0);
    }
    let plans = conn.reads(|c| plan(c, &due, now))?;
    let stored = conn.transaction(|c| apply(c, &due, plans, now))?;
    let put = put_jobs(queue, &stored);
    let queued: Vec<i64> = stored
        .iter()
        .zip(&put)
        .filter(|(s, &put)| put && s.to_put.is_some())
        .map(|(s, _)| s.message)
        .collect();
    let put_at = now_ms();
    let moves: Vec<store::Move> = stored
        .iter()
        .zip(&put)
        .filter(|(_, &put)| put)
        .map(|(s, _)| (s.entry, s.step, s.step + 1, s.next_due))
        .collect();
    conn.transaction(|c| {
        messages_sweep::queued_at(c, &queued, put_at)?;
        store::advance_many(c, &moves)?;
        for (s, _) in stored.iter().zip(put).filter(|(_, put)| !put) {
            store::postpone(c, s.entry, s.step, now + RETRY_MS)?;
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

/// What becomes of a due entry, decided on the batch's reads.
enum Plan {
    /// Its flow is gone or paused since: untouched.
    Skip,
    /// It has no such step (the flow lost steps): done.
    End,
    Leave(&'static str),
    /// Asked again in [`RETRY_MS`].
    Postpone,
    /// Its step's message, ready to store; when its next step is due.
    Send(Box<messages::submit::Ready>, Option<i64>),
    /// A `Send` whose message is still to be looked up (with the batch's
    /// others); [`plan`] leaves none.
    LookUp(Option<i64>),
}

/// A batch's flows and their steps, read once per batch.
type Flows = HashMap<i64, Option<(Flow, Vec<Step>)>>;

/// What a batch's entries are checked against, read once for the batch:
/// their flows and steps, who of them complained, and the members of
/// each join flow's list among them.
struct Context {
    flows: Flows,
    complained: HashSet<i64>,
    members: HashMap<i64, HashSet<i64>>,
}

impl Context {
    fn read(conn: &mut Conn, due: &[store::Due]) -> Result<Context, FlowError> {
        let mut flows: Flows = HashMap::new();
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
        }
        let recipients: Vec<i64> = due.iter().map(|d| d.recipient_id).collect();
        let complained = store::complained_among(conn, &recipients)?;
        let mut members: HashMap<i64, HashSet<i64>> = HashMap::new();
        for (flow, _) in flows.values().flatten() {
            if let (Trigger::Join, Some(list)) = (flow.trigger_kind, flow.list_id) {
                if let std::collections::hash_map::Entry::Vacant(slot) = members.entry(list) {
                    slot.insert(store::members_among(conn, list, &recipients)?);
                }
            }
        }
        Ok(Context {
            flows,
            complained,
            members,
        })
    }
}

impl Context {
    /// Entry `d`'s plan, and its step's message to look up when it is to
    /// be sent ([`Plan::LookUp`]).
    fn decide(&self, d: &store::Due, now: i64) -> (Plan, Option<Submit>) {
        let Some(Some((flow, steps))) = self.flows.get(&d.flow_id) else {
            return (Plan::Skip, None);
        };
        let Some(step) = steps.get(d.next_step as usize) else {
            return (Plan::End, None);
        };
        let member = |list: Option<i64>| {
            list.and_then(|l| self.members.get(&l))
                .is_some_and(|m| m.contains(&d.recipient_id))
        };
        let complained = self.complained.contains(&d.recipient_id);
        let verdict = match store::leave_reason(d.status, complained) {
            Some(reason) => Some(Plan::Leave(reason)),
            None => match flow.trigger_kind {
                Trigger::Sql => still_matched(flow, d, step),
                Trigger::Join if !member(flow.list_id) => Some(Plan::Leave("removed")),
                Trigger::Join => None,
            },
        };
        if let Some(p) = verdict {
            return (p, None);
        }
        let submit = Submit {
            template: step.template.clone(),
            to: to(&d.email, &d.name),
            data: Some(data_of(flow, d)),
            idempotency_key: Some(step_key(flow.id, d.id, d.next_step)),
        };
        let next_due = steps
            .get(d.next_step as usize + 1)
            .map(|s| (d.entered_at + s.delay_ms).max(now));
        (Plan::LookUp(next_due), Some(submit))
    }
}

/// Step 1 of [`batch`]: each entry's plan, on reads done for the batch.
fn plan(conn: &mut Conn, due: &[store::Due], now: i64) -> Result<Vec<Plan>, FlowError> {
    let context = Context::read(conn, due)?;
    let mut plans = Vec::with_capacity(due.len());
    let mut at = Vec::new();
    let mut submits = Vec::new();
    for (i, d) in due.iter().enumerate() {
        let (plan, submit) = context.decide(d, now);
        plans.push(plan);
        if let Some(s) = submit {
            at.push(i);
            submits.push(s);
        }
    }
    let looked = messages::submit::look_up(conn, submits, messages::AskedBy::Sender)
        .map_err(FlowError::from)?;
    for (i, ready) in at.into_iter().zip(looked) {
        plans[i] = match (ready, &plans[i]) {
            (Ok(r), Plan::LookUp(next_due)) => Plan::Send(Box::new(r), *next_due),
            (Err(MessageError::Refused(_)), _) => Plan::Leave("suppressed"),
            (Err(MessageError::Store(e)), _) => return Err(e.into()),
            (Err(e), _) => {
                // Template removed, an address the wire refuses: said once
                // per try, tried again later.
                let d = &due[i];
                tracing::warn!(flow = d.flow_id, entry = d.id, step = d.next_step, error = %e,
                    "flow step not sent; trying again in 10 s");
                Plan::Postpone
            }
            (Ok(_), _) => Plan::Postpone,
        };
    }
    Ok(plans)
}

/// Step 2 of [`batch`], inside its transaction: each entry's plan
/// carried out; the steps stored as messages, in one INSERT.
fn apply(
    conn: &mut Conn,
    due: &[store::Due],
    plans: Vec<Plan>,
    now: i64,
) -> Result<Vec<Stored>, FlowError> {
    let mut sends = Vec::new();
    let mut readies = Vec::new();
    for (d, p) in due.iter().zip(plans) {
        match p {
            Plan::Skip | Plan::LookUp(_) => {}
            Plan::End => {
                store::advance(conn, d.id, d.next_step, d.next_step, None)?;
            }
            Plan::Leave(reason) => {
                store::leave(conn, d.id, d.next_step, reason)?;
            }
            Plan::Postpone => store::postpone(conn, d.id, d.next_step, now + RETRY_MS)?,
            Plan::Send(ready, next_due) => {
                sends.push((d, next_due));
                readies.push(*ready);
            }
        }
    }
    let filed = messages::submit::store_ready_many(conn, readies)?;
    let mut stored = Vec::with_capacity(sends.len());
    for ((d, next_due), s) in sends.into_iter().zip(filed) {
        match s {
            Ok(s) if s.submitted.status == MessageStatus::Suppressed => {
                store::leave(conn, d.id, d.next_step, "suppressed")?;
            }
            Ok(s) => stored.push(Stored {
                entry: d.id,
                step: d.next_step,
                next_due,
                message: s.submitted.id,
                // Found again still queued (its job's put failed, or
                // the scheduler stopped before the entry moved on):
                // put again. Only one scheduler runs, so this is rare;
                // a second job is harmless.
                to_put: s.waiting.then_some(s.identity),
            }),
            Err(MessageError::Store(e)) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(flow = d.flow_id, entry = d.id, step = d.next_step, error = %e,
                    "flow step not sent; trying again in 10 s");
                store::postpone(conn, d.id, d.next_step, now + RETRY_MS)?;
            }
        }
    }
    Ok(stored)
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

/// Step 3 of [`batch`]: the stored messages' jobs, up to [`MAX_BATCH`]
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

/// Whether a SQL trigger's entry `d` may get its due `step` (`None`), or
/// waits or leaves: the last complete poll must have begun after the step
/// fell due (else it is tried again later: the source may be down) and
/// returned the entry's (email, key) (else it leaves, `no longer
/// matched`).
fn still_matched(flow: &Flow, d: &store::Due, step: &Step) -> Option<Plan> {
    // Due by the step's own time, not by a retry's.
    if flow.matched_at < d.entered_at + step.delay_ms {
        return Some(Plan::Postpone);
    }
    if d.seen_at < flow.matched_at {
        return Some(Plan::Leave(super::sql::NO_LONGER_MATCHED));
    }
    None
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
