//! A job's fate: a [`Tracker`] follows one reserved job until every claimed
//! recipient's outcome is durably recorded, then [`finish`] decides — delete
//! it, release it with a delay (retries due, paused campaign, another worker
//! still holding some of its recipients), or put its deferred recipients
//! (rate tokens far off, see `schedule`) into new delayed jobs, one per rate
//! group that deferred them, and delete it — and says so in one log line per
//! job with what happened to its recipients.

use std::time::{Duration, Instant};

use super::reserve::{Cmd, NewJob};
use super::shared::Shared;
use super::tracker::{Tally, Tracker};
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
    // Recipients held back for an A/B decision: the job comes back for
    // them then (never deleted, never put again as a new job).
    let held = t.held_until.map(super::ab::held_delay);
    let unclaimed = unclaimed || held.is_some();
    let defer_delay = defer_delay.max(held.unwrap_or_default());
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
