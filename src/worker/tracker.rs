//! What a worker knows of one reserved job while its recipients are out:
//! a [`Tracker`] counts the outcomes as they are recorded ([`Tally`]) and
//! gathers what they ask for (retries, deferrals, a hand-back), until
//! [`super::fate::finish`] decides the job's fate; [`Deferrals`] sums the
//! jobs that only deferred, for one log line now and then.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::store::deliveries::{OutcomeKind, Recorded};

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
    pub(super) fn only_deferred(&self) -> bool {
        self.deferred > 0
            && self.sent + self.failed + self.retried + self.skipped + self.lost == 0
            && self.handed_back == self.deferred
    }

    pub(super) fn count(&mut self, kind: &OutcomeKind, recorded: Recorded) {
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
    pub(super) outstanding: usize,
    pub(super) tally: Tally,
    /// Highest attempt among recipients left to retry.
    pub(super) retry_attempt: Option<i32>,
    /// Some recipients were handed back unsent.
    pub(super) unclaimed: bool,
    /// Recipients deferred for lack of rate tokens, by the group whose
    /// tokens are far off.
    pub(super) deferred: BTreeMap<String, Deferred>,
    /// Deferrals whose handing back is not recorded yet.
    pub(super) deferring: usize,
}

/// Recipients deferred for one rate group, and the longest of their delays.
#[derive(Default)]
pub(super) struct Deferred {
    pub(super) recipients: Vec<i64>,
    pub(super) delay: Duration,
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
    /// Recipients held back for an A/B test's decision: the job comes
    /// back at this time (ms; see [`super::ab`]).
    pub held_until: Option<i64>,
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
