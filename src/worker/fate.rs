//! A job's fate: a [`Tracker`] follows one reserved job until every claimed
//! recipient's outcome is durably recorded, then [`finish`] decides — delete
//! it, release it with a delay (retries due, paused campaign, another worker
//! still holding some of its recipients), or put its deferred recipients
//! (rate tokens far off, see `schedule`) into new delayed jobs, one per rate
//! group that deferred them, and delete it — and says so in one log line per
//! job with what happened to its recipients.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::flags::FlagState;
use super::reserve::{Cmd, NewJob};
use super::shared::Shared;
use super::tracker::{Deferred, Tally, Tracker};
use crate::queue::JobBody;
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

/// What a job's recorded outcomes leave to do, taken from its tracker.
struct Left {
    /// Highest attempt among recipients left to retry.
    retry_attempt: Option<i32>,
    /// Recipients handed back unsent, or held for an A/B decision: the job
    /// comes back for them (never deleted, never put again as a new job).
    unclaimed: bool,
    /// Recipients deferred for lack of rate tokens, by rate group.
    deferred: BTreeMap<String, Deferred>,
    /// The longest wait among the deferred recipients and the A/B hold.
    defer_delay: Duration,
    /// Another worker holds some recipients until then (ms).
    busy_until: Option<i64>,
    tally: Tally,
}

impl Left {
    fn take(t: &Tracker) -> Left {
        let (retry_attempt, unclaimed, deferred, tally) = {
            let mut p = t.progress.lock().unwrap_or_else(|e| e.into_inner());
            (
                p.retry_attempt,
                p.unclaimed,
                std::mem::take(&mut p.deferred),
                p.tally,
            )
        };
        let held = t.held_until.map(super::ab::held_delay);
        let defer_delay = deferred.values().map(|d| d.delay).max().unwrap_or_default();
        Left {
            retry_attempt,
            unclaimed: unclaimed || held.is_some(),
            deferred,
            defer_delay: defer_delay.max(held.unwrap_or_default()),
            busy_until: t.busy_until,
            tally,
        }
    }

    /// Some recipients are still to be sent, by this job or new ones.
    fn open(&self) -> bool {
        self.unclaimed || self.retry_attempt.is_some() || !self.deferred.is_empty()
    }
}

/// A finished job's fate, before it becomes its server thread's command.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    Delete,
    Release(Duration),
    /// The deferred recipients go into new jobs; the longest delay is the
    /// job's release should a put fail.
    Defer(Duration),
}

/// The fate of a job with `left` to do, its campaign's `flags` as this
/// worker last saw them, at `now` (ms).
fn decide(left: &Left, flags: Option<FlagState>, now: i64) -> Fate {
    let open = left.open();
    match flags {
        Some(f) if f.flags.state == CampaignState::Cancelled => Fate::Delete,
        Some(f) if f.flags.paused && open => Fate::Release(pause_delay(f.paused_since)),
        // Its start was moved later while the job was in hand.
        Some(f) if open && f.flags.before_start(now) => {
            Fate::Release(crate::send_at::wait(f.flags.send_at, now).unwrap_or(left.defer_delay))
        }
        // Only deferred recipients left: they go on in a job of their own.
        _ if !left.deferred.is_empty()
            && !left.unclaimed
            && left.retry_attempt.is_none()
            && left.busy_until.is_none() =>
        {
            Fate::Defer(left.defer_delay)
        }
        // Others to retry as well: one release covers them all.
        _ => match (left.retry_attempt, left.unclaimed, left.busy_until) {
            (Some(a), _, _) => Fate::Release(retry_delay(a).max(left.defer_delay)),
            (None, true, _) => Fate::Release(left.defer_delay),
            (None, false, Some(until)) => Fate::Release(
                Duration::from_millis((until - now).max(0) as u64 + 1_000).max(left.defer_delay),
            ),
            (None, false, None) if open => Fate::Release(left.defer_delay),
            (None, false, None) => Fate::Delete,
        },
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
    let left = Left::take(t);
    let flags = shared.campaigns.flag_state(t.campaign_id).await;
    let fate = decide(&left, flags, now_ms());
    let cmd = match fate {
        Fate::Delete => Cmd::Delete(t.job_id),
        Fate::Release(delay) => Cmd::Release {
            id: t.job_id,
            priority: t.priority,
            delay,
        },
        Fate::Defer(delay) => Cmd::Defer {
            id: t.job_id,
            priority: t.priority,
            delay,
            jobs: left
                .deferred
                .into_values()
                .map(|d| NewJob {
                    delay: d.delay,
                    body: JobBody::new(t.campaign_id, d.recipients).encode(&shared.identity),
                })
                .collect(),
        },
    };
    log_finished(shared, t, &left.tally, &cmd);
    shared.cmd(t.server, cmd);
    t.done.cancel();
    drop(t.permit.lock().unwrap_or_else(|e| e.into_inner()).take());
}

/// A finished job's log lines: its own, or (when it only deferred) a
/// summary now and then; a warning for outcomes that were lost.
fn log_finished(shared: &Shared, t: &Tracker, tally: &Tally, cmd: &Cmd) {
    let then = what_then(cmd);
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
        log_job_line(t, tally, &then);
    }
    if tally.lost > 0 {
        tracing::warn!(
            job = t.job_id,
            campaign = t.campaign_id,
            lost = tally.lost,
            "outcomes not recorded: their claims had lapsed and another worker holds these recipients (its outcome stands, ours is dropped)"
        );
    }
}

/// The line every finished job gets (but those that only deferred).
fn log_job_line(t: &Tracker, tally: &Tally, then: &impl std::fmt::Display) {
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
    use crate::store::campaigns::Flags;

    const NOW: i64 = 1_000_000;

    fn left() -> Left {
        Left {
            retry_attempt: None,
            unclaimed: false,
            deferred: BTreeMap::new(),
            defer_delay: Duration::ZERO,
            busy_until: None,
            tally: Tally::default(),
        }
    }

    fn deferring(delay: Duration) -> Left {
        let mut l = left();
        l.deferred.insert(
            "slow".into(),
            Deferred {
                recipients: vec![1],
                delay,
            },
        );
        l.defer_delay = delay;
        l
    }

    fn flags(state: CampaignState, paused: bool, send_at: Option<i64>) -> Option<FlagState> {
        Some(FlagState {
            flags: Flags {
                state,
                paused,
                send_at,
            },
            paused_since: None,
        })
    }

    #[test]
    fn a_job_with_nothing_left_is_deleted_whatever_its_flags() {
        assert_eq!(decide(&left(), None, NOW), Fate::Delete);
        let paused = flags(CampaignState::Queued, true, Some(NOW + 60_000));
        assert_eq!(decide(&left(), paused, NOW), Fate::Delete);
    }

    #[test]
    fn a_cancelled_campaign_deletes_even_open_jobs() {
        let mut l = deferring(Duration::from_secs(30));
        l.retry_attempt = Some(2);
        let cancelled = flags(CampaignState::Cancelled, false, None);
        assert_eq!(decide(&l, cancelled, NOW), Fate::Delete);
    }

    #[test]
    fn a_paused_or_not_yet_started_campaign_releases_open_jobs() {
        let l = deferring(Duration::from_secs(30));
        let paused = flags(CampaignState::Queued, true, None);
        assert_eq!(decide(&l, paused, NOW), Fate::Release(PAUSE_DELAY_MIN));
        let later = flags(CampaignState::Queued, false, Some(NOW + 90_500));
        assert_eq!(
            decide(&l, later, NOW),
            Fate::Release(Duration::from_secs(91))
        );
    }

    #[test]
    fn only_deferred_recipients_go_on_in_new_jobs() {
        let l = deferring(Duration::from_secs(30));
        assert_eq!(decide(&l, None, NOW), Fate::Defer(Duration::from_secs(30)));
        let running = flags(CampaignState::Queued, false, Some(NOW - 1));
        assert_eq!(
            decide(&l, running, NOW),
            Fate::Defer(Duration::from_secs(30))
        );
    }

    #[test]
    fn deferred_with_others_open_is_one_release_for_the_longest_wait() {
        let mut retried = deferring(Duration::from_secs(30));
        retried.retry_attempt = Some(1);
        assert_eq!(
            decide(&retried, None, NOW),
            Fate::Release(Duration::from_secs(30))
        );
        retried.retry_attempt = Some(4);
        assert_eq!(decide(&retried, None, NOW), Fate::Release(retry_delay(4)));

        let mut unclaimed = deferring(Duration::from_secs(30));
        unclaimed.unclaimed = true;
        assert_eq!(
            decide(&unclaimed, None, NOW),
            Fate::Release(Duration::from_secs(30))
        );

        let mut busy = deferring(Duration::from_secs(3));
        busy.busy_until = Some(NOW + 10_000);
        assert_eq!(
            decide(&busy, None, NOW),
            Fate::Release(Duration::from_secs(11))
        );
    }

    #[test]
    fn a_job_whose_recipients_another_worker_holds_comes_back_after_them() {
        let mut l = left();
        l.busy_until = Some(NOW + 2_000);
        assert_eq!(decide(&l, None, NOW), Fate::Release(Duration::from_secs(3)));
        l.busy_until = Some(NOW - 5_000);
        assert_eq!(decide(&l, None, NOW), Fate::Release(Duration::from_secs(1)));
    }
}
