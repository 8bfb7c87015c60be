//! The sweep for lost message jobs. A message's job can be lost while its
//! row waits: beanstalkd restarted without its binlog, a put that failed
//! after the row was stored and that no client retried, a worker killed
//! holding the claim while the job went too. Nothing would then ever
//! send it. The worker that holds the flow scheduler's lease (see
//! `flows::scheduler`) sweeps for them about every [`every`]: the
//! messages still waiting a grace period ([`grace`]) after their next
//! attempt fell due are suspects; those the sweep before found waiting
//! too get their jobs again, in the band each belongs to, up to
//! [`MAX_BATCH`] a job.
//!
//! A job put twice is harmless (the claim sends a message at most once),
//! but must not be the normal case. A message put back for a retry waits
//! out its delay first (its `next_attempt_at` is the delay's end), and one
//! whose job waits its turn in the queue is left alone: within the grace
//! period, and also behind a backlog of flow batches, whose oldest ready
//! job's age is added to the grace ([`queue_wait`]). A job a worker has
//! reserved and not yet claimed is in neither the ready queue nor a claim:
//! one sweep cannot tell it from a lost one, so a message is put again
//! only when two sweeps in a row, [`every`] apart, found it waiting
//! ([`Suspects`]); a claim comes well within that.

use std::time::Duration;

use super::submit::{put, Queue};
use crate::queue::message::{band_of, Band, MAX_BATCH};
use crate::queue::timed::Timed;
use crate::queue::QueueError;
use crate::store::messages_sweep::{Cursor, Waiting};
use crate::store::{installation, messages_sweep, now_ms, Conn, StoreError};
use crate::tokens::Identity;

/// How long past its due time a message waits for its job before the
/// sweep puts another, unless the hidden `MAILSPLIT_SWEEP_GRACE_MS` (at
/// least 100) says otherwise; the sweep runs every half of it.
pub const GRACE: Duration = Duration::from_secs(60);
/// Messages read (and their jobs put) per page, each page a call on the
/// database after the lease is renewed.
pub const PAGE: i64 = 1_000;
/// Pages per sweep at most: a sweep ends in bounded time; the next one
/// goes on where it stopped.
pub const MAX_PAGES: usize = 100;
/// The idempotency key of a flow's step begins so
/// (`flows::scheduler::step_key`): its job goes in the flows' band.
pub const FLOW_KEY_PREFIX: &str = "flow:";
/// Deadline of each question to beanstalkd about its queue.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// beanstalkd tells a job's age in whole seconds, rounded down: one more
/// keeps the messages stored just before their job was put on the safe
/// side.
const AGE_STEP: Duration = Duration::from_secs(1);

/// Why a sweep stopped.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot put the lost messages' jobs again")]
    Queue(#[from] QueueError),
}

/// The grace period in force (see [`GRACE`]).
pub fn grace() -> Duration {
    std::env::var("MAILSPLIT_SWEEP_GRACE_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms >= 100)
        .map_or(GRACE, Duration::from_millis)
}

/// How often the lease holder sweeps: every half grace period.
pub fn every() -> Duration {
    grace() / 2
}

/// The band of a message's job, by its idempotency key.
pub fn band_of_key(key: Option<&str>) -> Band {
    match key {
        Some(k) if k.starts_with(FLOW_KEY_PREFIX) => Band::Flow,
        _ => Band::Transactional,
    }
}

/// How long the message jobs ready on the queue have waited for a
/// worker: the age of the flow batch at the head of each server's ready
/// queue (the oldest of its band: beanstalkd hands out a priority's jobs
/// in order), zero when no message job is ready there. `None` when a
/// transactional job heads a server's queue (flow batches behind it may
/// have waited any time), or the flow batch at the head was taken before
/// its age could be read: the sweep waits for its next turn rather than
/// put jobs twice. Every server is asked; one that does not answer fails
/// the sweep (its jobs are out of reach, not lost).
pub fn queue_wait(queue: &Queue) -> Result<Option<Duration>, QueueError> {
    let mut waited = Duration::ZERO;
    for &addr in &queue.servers {
        let head = Timed::connect(addr, ASK_TIMEOUT)?.ready_head(&queue.tube)?;
        let Some(head) = head else {
            continue;
        };
        match (band_of(&head.body), head.age) {
            (Some(Band::Flow), Some(age)) => waited = waited.max(age + AGE_STEP),
            (Some(_), _) => return Ok(None),
            (None, _) => {}
        }
    }
    Ok(Some(waited))
}

/// The messages the last sweep found waiting (sorted by id; at most
/// [`PAGE`] × [`MAX_PAGES`]): the next sweep puts the jobs of those still
/// waiting. Kept by the lease holder in memory: a new holder starts with
/// none, and its first sweep only suspects.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Suspects(Vec<i64>);

impl Suspects {
    /// How many messages are suspected.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One sweep, a page at a time (each page a call on the database, after
/// which the caller renews its lease): first the last sweep's suspects
/// still waiting get their jobs again, [`PAGE`] ids a page; then the
/// messages waiting now are read, [`PAGE`] a page up to [`MAX_PAGES`],
/// as the next sweep's suspects.
#[derive(Debug)]
pub struct Sweep {
    /// When the sweep started: claims lapsed by then are no claims.
    now: i64,
    /// Messages due before this have waited past the grace period.
    before: i64,
    /// The last sweep's suspects not yet looked at again.
    last: std::vec::IntoIter<i64>,
    /// The suspects found so far.
    next: Vec<i64>,
    after: Cursor,
    pages: usize,
    read_all: bool,
    /// Messages whose jobs were put again.
    pub put: usize,
}

impl Sweep {
    /// A sweep at `now` of the messages due before `before`, after the
    /// sweep that found `suspects`.
    pub fn new(suspects: Suspects, now: i64, before: i64) -> Self {
        Sweep {
            now,
            before,
            last: suspects.0.into_iter(),
            next: Vec::new(),
            after: Cursor::START,
            pages: 0,
            read_all: false,
            put: 0,
        }
    }

    /// One page; whether there is more to do. A put that fails ends the
    /// sweep with an error (beanstalkd is down: nothing more would go
    /// through) after the jobs put so far are marked; the next sweep
    /// then starts with no suspects.
    pub fn step(&mut self, conn: &mut Conn, queue: &Queue) -> Result<bool, SweepError> {
        if self.last.len() > 0 {
            let ids: Vec<i64> = self.last.by_ref().take(PAGE as usize).collect();
            let waiting = messages_sweep::still_lost(conn, &ids, self.now, self.before)?;
            self.put += put_again(conn, queue, &waiting, self.before)?;
            return Ok(true);
        }
        if self.read_all || self.pages >= MAX_PAGES {
            return Ok(false);
        }
        let page = messages_sweep::lost(conn, self.now, self.before, self.after, PAGE)?;
        self.pages += 1;
        self.read_all = page.len() < PAGE as usize;
        if let Some(last) = page.last() {
            self.after = last.cursor();
        }
        self.next.extend(page.iter().map(|w| w.id));
        Ok(!self.read_all && self.pages < MAX_PAGES)
    }

    /// The suspects the next sweep looks at again.
    pub fn suspects(mut self) -> Suspects {
        self.next.sort_unstable();
        Suspects(self.next)
    }
}

/// `waiting` get their jobs again, in the band each belongs to, and each
/// then waits a grace period before a later sweep may suspect it again.
fn put_again(
    conn: &mut Conn,
    queue: &Queue,
    waiting: &[Waiting],
    before: i64,
) -> Result<usize, SweepError> {
    if waiting.is_empty() {
        return Ok(0);
    }
    tracing::debug!(
        found = waiting.len(),
        first = waiting.first().map(|w| w.id),
        last = waiting.last().map(|w| w.id),
        before,
        "message sweep: messages waiting for a lost job, two sweeps in a row"
    );
    let identity = Identity::from(&installation::load(conn)?);
    let (flows, others): (Vec<_>, Vec<_>) = waiting
        .iter()
        .partition(|w| band_of_key(w.idempotency_key.as_deref()) == Band::Flow);
    let mut done = Vec::with_capacity(waiting.len());
    let mut failed = None;
    'bands: for (band, waiting) in [(Band::Transactional, others), (Band::Flow, flows)] {
        let ids: Vec<i64> = waiting.iter().map(|w| w.id).collect();
        for chunk in ids.chunks(MAX_BATCH) {
            if let Err(e) = put(queue, &identity, chunk, band) {
                failed = Some(e);
                break 'bands;
            }
            done.extend_from_slice(chunk);
        }
    }
    messages_sweep::mark_put(conn, &done, before, now_ms())?;
    match failed {
        Some(e) => {
            if !done.is_empty() {
                tracing::warn!(error = %e, put = done.len(), "message sweep: some jobs were put again, then beanstalkd refused");
            }
            Err(e.into())
        }
        None => Ok(done.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_step_goes_back_in_the_flows_band() {
        let key = crate::flows::scheduler::step_key(3, 14, 1);
        assert_eq!(band_of_key(Some(&key)), Band::Flow);
        assert_eq!(band_of_key(Some("order-17")), Band::Transactional);
        assert_eq!(band_of_key(None), Band::Transactional);
    }
}
