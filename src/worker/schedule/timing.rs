//! How long the scheduler lets a message wait, park or be deferred: the
//! bounds it keeps messages within, per kind of group.

use std::time::Duration;

/// A message is parked only if its tokens are expected within this long;
/// otherwise it is deferred at once.
pub const MAX_PARK: Duration = Duration::from_secs(2);
/// A queue keeps what is expected to go within this long at the share of
/// the group this worker measures (other workers share it); the newest
/// messages beyond are deferred.
pub const MAX_PARK_AGE: Duration = Duration::from_secs(4);
/// Nothing stays parked longer than this, whatever the estimates (well
/// within a job's TTR).
pub const MAX_PARKED_FOR: Duration = Duration::from_secs(10);

/// How far ahead a group's queue may hold messages: (longest expected wait
/// to park a new message, what a queue keeps at this worker's share).
/// Deferring lets other mail past a slow group; but every message of this
/// worker counts against its relay's group, so deferring for the relay
/// frees nothing for anyone: it only churns jobs (hand back, put, claim
/// again) and leaves gaps when the deferred jobs are all not yet due. For
/// the relay's group a queue holds up to [`MAX_PARKED_FOR`], and the job
/// slots (bounded) are the back-pressure.
pub(super) fn horizon(group: &str) -> (Duration, Duration) {
    if crate::rate_group::Group::is_relay_name(group) {
        (MAX_PARKED_FOR, MAX_PARKED_FOR)
    } else {
        (MAX_PARK, MAX_PARK_AGE)
    }
}
/// A deferred job comes back after the group's next token is due plus the
/// estimated backlog ahead of it, but the backlog part is capped at this, so
/// a `rate set` that raises the rate is soon met by enough work.
pub(super) const MAX_BACKLOG_DELAY: Duration = Duration::from_secs(4);
/// A deferred message comes back this long before its expected turn, so
/// that it is parked again while its queue still holds work: coming back
/// takes a reserve and a claim, and the workers' shares shift meanwhile.
/// Back exactly on time, the queue runs dry first and the group's rate
/// dips until the work arrives.
pub(super) const DEFER_EARLY: Duration = Duration::from_secs(1);
/// Deferral delays are kept within these bounds.
pub(super) const MIN_DEFER_DELAY: Duration = Duration::from_secs(1);
pub(super) const MAX_DEFER_DELAY: Duration = Duration::from_secs(3_600);
/// Longest the scheduling sender sleeps before looking again (a refresh of
/// the groups or a campaign's flags may have changed things).
pub(super) const MAX_SLEEP: Duration = Duration::from_millis(200);
/// Messages looked at per queue per pass (bounds one pass's work).
pub(super) const TRIES_PER_QUEUE: usize = 64;
