//! A job's fate: a [`Tracker`] follows one reserved job until every claimed
//! recipient's outcome is durably recorded, then [`finish`] decides — delete
//! it, release it with a delay (retries due, paused campaign, another worker
//! still holding some of its recipients), or put its deferred recipients
//! (rate tokens far off, see `schedule`) into new delayed jobs, one per rate
//! group that deferred them, and delete it — and says so in one log line per
//! job with what happened to its recipients.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::pipeline::Shared;
use super::reserve::{Cmd, NewJob};
use crate::queue::JobBody;
use crate::store::deliveries::{OutcomeKind, Recorded};
use crate::store::{now_ms, CampaignState};

/// Bounds of the delay a paused campaign's job is released with. It grows
/// with the time the pause has lasted so an hours-long pause does not churn
/// the queue (and beanstalkd's binlog) every few seconds.
const PAUSE_DELAY_MIN: Duration = Duration::from_secs(1);
const PAUSE_DELAY_MAX: Duration = Duration::from_secs(120);
/// First delay before a transient failure is retried; doubles per attempt.
const RETRY_DELAY_BASE: Duration = Duration::from_secs(5);
const RETRY_DELAY_MAX: Duration = Duration::from_secs(600);

/// The delay for a paused campaign's job: as long as the pause has lasted,
/// within bounds.
pub fn pause_delay(since: Option<Instant>) -> Duration {
    since
        .map_or(PAUSE_DELAY_MIN, |s| s.elapsed())
        .clamp(PAUSE_DELAY_MIN, PAUSE_DELAY_MAX)
}

/// The delay before retrying after the given attempt failed transiently.
pub fn retry_delay(attempt: i32) -> Duration {
    let doublings = attempt.clamp(1, 16) as u32 - 1;
    RETRY_DELAY_BASE
        .saturating_mul(1 << doublings)
        .min(RETRY_DELAY_MAX)
}

/// What happened to a job's claimed recipients: its summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub claimed: usize,
    pub sent: usize,
    /// Failed for good: a permanent reply, or the last allowed attempt.
    pub failed: usize,
    /// Transient failure: tried again later.
    pub retried: usize,
    pub skipped: usize,
    /// Handed back unsent (paused, stopping), or deferred to a new delayed
    /// job (rate tokens far off; also counted in `deferred`).
    pub handed_back: usize,
    pub deferred: usize,
    /// The claim had lapsed and another worker held the row.
    pub lost: usize,
}

impl Tally {
    /// Nothing happened to the job's recipients but a deferral to later
    /// jobs (their rate groups' tokens are far off).
    fn only_deferred(&self) -> bool {
        self.deferred > 0
            && self.sent + self.failed + self.retried + self.skipped + self.lost == 0
            && self.handed_back == self.deferred
    }

    fn count(&mut self, kind: &OutcomeKind, recorded: Recorded) {
        let slot = match (kind, recorded) {
            (_, Recorded::Lost) => &mut self.lost,
            (OutcomeKind::Sent, _) => &mut self.sent,
            (OutcomeKind::Failed(_) | OutcomeKind::Bounced(_), _)
            | (OutcomeKind::Retry(_), Recorded::Final) => &mut self.failed,
            (OutcomeKind::Retry(_), _) => &mut self.retried,
            (OutcomeKind::Skipped(_), _) => &mut self.skipped,
            (OutcomeKind::Unclaim, _) => &mut self.handed_back,
        };
        *slot += 1;
    }
}

/// How far a job has come: outcomes still to record, and what the recorded
/// ones ask for.
#[derive(Default)]
pub struct Progress {
    outstanding: usize,
    tally: Tally,
    /// Highest attempt among recipients left to retry.
    retry_attempt: Option<i32>,
    /// Some recipients were handed back unsent.
    unclaimed: bool,
    /// Recipients deferred for lack of rate tokens, by the group whose
    /// tokens are far off.
    deferred: BTreeMap<String, Deferred>,
    /// Deferrals whose handing back is not recorded yet.
    deferring: usize,
}

/// Recipients deferred for one rate group, and the longest of their delays.
#[derive(Default)]
struct Deferred {
    recipients: Vec<i64>,
    delay: Duration,
}

impl Progress {
    /// A job with `outstanding` claimed recipients.
    pub fn new(outstanding: usize) -> Progress {
        Progress {
            outstanding,
            tally: Tally {
                claimed: outstanding,
                ..Tally::default()
            },
            ..Progress::default()
        }
    }
}

/// Follows one reserved job until all its outcomes are recorded.
pub struct Tracker {
    pub server: usize,
    pub job_id: u64,
    pub campaign_id: i64,
    pub token: i64,
    pub priority: u32,
    /// Another worker holds some recipients until then (ms).
    pub busy_until: Option<i64>,
    pub progress: Mutex<Progress>,
    pub permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Cancelled when the job is finished (stops its touch loop).
    pub done: CancellationToken,
    /// Until when its messages may be started (see [`super::lease`]).
    pub lease: super::lease::Lease,
}

impl Tracker {
    /// Recipient `rid` is deferred for `delay` (the tokens of `group` are
    /// that far off); its `Unclaim` outcome follows through the reporter.
    pub fn defer(&self, rid: i64, group: &str, delay: Duration) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let d = p.deferred.entry(group.to_string()).or_default();
        d.recipients.push(rid);
        d.delay = d.delay.max(delay);
        p.deferring += 1;
    }

    /// Note a recorded outcome; returns true when it was the job's last.
    pub fn complete(&self, kind: &OutcomeKind, recorded: Recorded, attempt: i32) -> bool {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.tally.count(kind, recorded);
        if *kind == OutcomeKind::Unclaim && p.deferring > 0 {
            // A deferral: it goes into the new job, not a release.
            p.deferring -= 1;
            p.tally.deferred += 1;
        } else if recorded == Recorded::Open {
            match kind {
                OutcomeKind::Unclaim => p.unclaimed = true,
                _ => p.retry_attempt = Some(p.retry_attempt.map_or(attempt, |b| b.max(attempt))),
            }
        }
        p.outstanding = p.outstanding.saturating_sub(1);
        p.outstanding == 0
    }
}

/// Decide the fate of a job whose outcomes are all recorded, tell its server
/// thread, and free its slot.
///
/// Deferred recipients go into new jobs (same campaign, priority and tube,
/// signed like every job, delayed until their tokens are due), one per rate
/// group that deferred them, so a recipient held back by a fast group's
/// short queue does not wait out a slow group's long delay. They are put on
/// the job's own server before the job is deleted, by its server thread.
/// Their claims were handed back first, so whichever job a worker reserves
/// claims them; a crash between the puts and the delete leaves both, and
/// the ledger's claim still sends each recipient once. A failed put
/// releases the job instead (nobody is lost).
pub async fn finish(shared: &Shared, t: &Tracker) {
    let (retry_attempt, unclaimed, deferred, tally) = {
        let mut p = t.progress.lock().unwrap_or_else(|e| e.into_inner());
        (
            p.retry_attempt,
            p.unclaimed,
            std::mem::take(&mut p.deferred),
            p.tally,
        )
    };
    let defer_delay = deferred.values().map(|d| d.delay).max().unwrap_or_default();
    let flags = shared.campaigns.flag_state(t.campaign_id).await;
    let release = |delay: Duration| Cmd::Release {
        id: t.job_id,
        priority: t.priority,
        delay,
    };
    let open = unclaimed || retry_attempt.is_some() || !deferred.is_empty();
    let cmd = match flags {
        Some(f) if f.flags.state == CampaignState::Cancelled => Cmd::Delete(t.job_id),
        Some(f) if f.flags.paused && open => release(pause_delay(f.paused_since)),
        // Its start was moved later while the job was in hand.
        Some(f) if open && f.flags.before_start(now_ms()) => {
            release(crate::send_at::wait(f.flags.send_at, now_ms()).unwrap_or(defer_delay))
        }
        // Only deferred recipients left: they go on in a job of their own.
        _ if !deferred.is_empty()
            && !unclaimed
            && retry_attempt.is_none()
            && t.busy_until.is_none() =>
        {
            Cmd::Defer {
                id: t.job_id,
                priority: t.priority,
                delay: defer_delay,
                jobs: deferred
                    .into_values()
                    .map(|d| NewJob {
                        delay: d.delay,
                        body: JobBody::new(t.campaign_id, d.recipients).encode(&shared.identity),
                    })
                    .collect(),
            }
        }
        // Others to retry as well: one release covers them all.
        _ => match (retry_attempt, unclaimed, t.busy_until) {
            (Some(a), _, _) => release(retry_delay(a).max(defer_delay)),
            (None, true, _) => release(defer_delay),
            (None, false, Some(until)) => release(
                Duration::from_millis((until - now_ms()).max(0) as u64 + 1_000).max(defer_delay),
            ),
            (None, false, None) if open => release(defer_delay),
            (None, false, None) => Cmd::Delete(t.job_id),
        },
    };
    let then = what_then(&cmd);
    if tally.only_deferred() {
        // A throttled group defers the same recipients job after job: one
        // line per interval says so, the jobs themselves go to debug.
        tracing::debug!(job = t.job_id, campaign = t.campaign_id, deferred = tally.deferred, then = %then, "job finished");
        if let Some(s) = shared.deferrals.add(tally.deferred, Instant::now()) {
            tracing::info!(
                jobs = s.jobs,
                recipients = s.recipients,
                seconds = s.over.as_secs(),
                "jobs finished by deferring their recipients to later jobs (rate limits); nothing else happened in them"
            );
        }
    } else {
        log_finished(t, &tally, &then);
    }
    if tally.lost > 0 {
        tracing::warn!(
            job = t.job_id,
            campaign = t.campaign_id,
            lost = tally.lost,
            "outcomes not recorded: their claims had lapsed and another worker holds these recipients (its outcome stands, ours is dropped)"
        );
    }
    shared.cmd(t.server, cmd);
    t.done.cancel();
    drop(t.permit.lock().unwrap_or_else(|e| e.into_inner()).take());
}

/// The line every finished job gets (but those that only deferred).
fn log_finished(t: &Tracker, tally: &Tally, then: &impl std::fmt::Display) {
    tracing::info!(
        job = t.job_id,
        campaign = t.campaign_id,
        claimed = tally.claimed,
        sent = tally.sent,
        failed = tally.failed,
        retried = tally.retried,
        skipped = tally.skipped,
        handed_back = tally.handed_back,
        deferred = tally.deferred,
        lost = tally.lost,
        then = %then,
        "job finished"
    );
}

/// How often the jobs that only deferred are summed up in the log.
const DEFERRALS_LOGGED_EVERY: Duration = Duration::from_secs(30);

/// Jobs that did nothing but defer their recipients, counted since the
/// last summary line.
#[derive(Debug, Default)]
pub struct Deferrals {
    counted: Mutex<DeferralCount>,
}

#[derive(Debug, Default)]
struct DeferralCount {
    since: Option<Instant>,
    jobs: u64,
    recipients: u64,
}

/// What a summary line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferralSummary {
    pub jobs: u64,
    pub recipients: u64,
    pub over: Duration,
}

impl Deferrals {
    /// Count one job that deferred `recipients`; the summary to log when
    /// the first such job is [`DEFERRALS_LOGGED_EVERY`] old (the count
    /// starts again), else `None`. The first job of a quiet spell is
    /// logged at once, so a throttle shows as soon as it begins.
    pub fn add(&self, recipients: usize, now: Instant) -> Option<DeferralSummary> {
        let mut c = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        let first = c.since.is_none();
        let since = *c.since.get_or_insert(now);
        c.jobs += 1;
        c.recipients += recipients as u64;
        let over = now.saturating_duration_since(since);
        if !first && over < DEFERRALS_LOGGED_EVERY {
            return None;
        }
        let summary = DeferralSummary {
            jobs: c.jobs,
            recipients: c.recipients,
            over,
        };
        *c = DeferralCount {
            since: Some(now),
            jobs: 0,
            recipients: 0,
        };
        Some(summary)
    }
}

/// What becomes of a finished job, for its log line.
fn what_then(cmd: &Cmd) -> String {
    match cmd {
        Cmd::Delete(_) => "deleted".to_string(),
        Cmd::Release { delay, .. } => format!("released for {delay:?}"),
        Cmd::Defer { jobs, .. } => {
            let due: Vec<String> = jobs.iter().map(|j| format!("{:?}", j.delay)).collect();
            format!(
                "deferred recipients put in {} new job(s) due in {}, job deleted",
                jobs.len(),
                due.join(", ")
            )
        }
        other => format!("{other:?}"),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_that_only_deferred_make_one_line_per_interval() {
        let d = Deferrals::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // The first one says at once that deferring began.
        let first = d.add(100, at(0)).expect("the first is logged");
        assert_eq!((first.jobs, first.recipients), (1, 100));
        // 147 more within the interval: not one line.
        for i in 1..=147 {
            assert_eq!(d.add(100, at(i * 100)), None, "job {i}");
        }
        let next = d.add(50, at(30_000)).expect("the interval is over");
        assert_eq!((next.jobs, next.recipients), (148, 14_750));
        assert_eq!(next.over, Duration::from_secs(30));
        assert_eq!(d.add(1, at(30_001)), None, "counting starts again");
    }

    #[test]
    fn only_a_job_with_nothing_but_deferrals_is_summed() {
        let deferred = Tally {
            claimed: 100,
            handed_back: 100,
            deferred: 100,
            ..Tally::default()
        };
        assert!(deferred.only_deferred());
        assert!(!Tally {
            sent: 1,
            ..deferred
        }
        .only_deferred());
        assert!(
            !Tally {
                handed_back: 101,
                ..deferred
            }
            .only_deferred(),
            "paused ones too"
        );
        assert!(!Tally::default().only_deferred());
    }

    #[test]
    fn the_tally_counts_each_outcome_once_by_what_it_became() {
        let mut t = Tally::default();
        let reply = || "550 5.1.1 no".to_string();
        t.count(&OutcomeKind::Sent, Recorded::Final);
        t.count(&OutcomeKind::Failed(reply()), Recorded::Final);
        t.count(&OutcomeKind::Bounced(reply()), Recorded::Final);
        // The last allowed attempt of a transient failure is a failure.
        t.count(&OutcomeKind::Retry(reply()), Recorded::Final);
        t.count(&OutcomeKind::Retry(reply()), Recorded::Open);
        t.count(
            &OutcomeKind::Skipped("unsubscribed".into()),
            Recorded::Final,
        );
        t.count(&OutcomeKind::Unclaim, Recorded::Open);
        t.count(&OutcomeKind::Sent, Recorded::Lost);
        assert_eq!(
            t,
            Tally {
                claimed: 0,
                sent: 1,
                failed: 3,
                retried: 1,
                skipped: 1,
                handed_back: 1,
                deferred: 0,
                lost: 1,
            }
        );
    }
}
