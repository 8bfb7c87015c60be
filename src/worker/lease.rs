//! The fence: a job's claim lease as this worker knows it. The ledger
//! holds each claim until `claimed_until` (claim time + [`job_ttr`]);
//! after that another worker may take the recipient over with a claim
//! token of its own, and this worker's outcome for it no longer matches
//! any row (it is recorded as `lost`). So this worker must not *start* a
//! message once its claim may have lapsed: it counts the lease on its own
//! monotonic clock from the moment it *asked* for the claim or its last
//! extension (the database's lease starts later, never earlier), and stops
//! [`fence_margin`] before the end, leaving a started message that long to
//! be on the wire. A worker that cannot reach the database cannot extend,
//! so within `job_ttr() - fence_margin()` (20 s by default) of its last confirmed
//! extension it hands every unsent message of the job back instead of
//! sending it, however long the partition lasts.
//!
//! An extension counts only if its answer came back before the fence: an
//! answer that arrives later may come after another worker took some of
//! the job's recipients, so the job stays fenced (its messages are handed
//! back, and the job comes back through the queue).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::queue::job_ttr;

/// How long before the end of its claim lease a worker stops starting
/// messages of the job: a third of the lease (10 s of the default 30 s).
pub fn fence_margin() -> Duration {
    job_ttr() / 3
}

/// Until when this worker may start messages of one job.
pub struct Lease {
    fence: Mutex<Instant>,
    /// The job hit its fence (logged once).
    fenced: AtomicBool,
}

impl Lease {
    /// A lease for a claim asked for at `asked`.
    pub fn new(asked: Instant) -> Lease {
        Lease {
            fence: Mutex::new(asked + job_ttr() - fence_margin()),
            fenced: AtomicBool::new(false),
        }
    }

    /// An extension asked for at `asked` succeeded, and its answer came at
    /// `answered`. Returns false when the answer came too late to count
    /// (the fence had passed): the job stays fenced.
    pub fn extended(&self, asked: Instant, answered: Instant) -> bool {
        let mut fence = self.fence.lock().unwrap_or_else(|p| p.into_inner());
        if answered >= *fence {
            return false;
        }
        *fence = (*fence).max(asked + job_ttr() - fence_margin());
        true
    }

    /// Whether a message of the job may be started now. The first time
    /// it may not, says so in the log.
    pub fn open(&self, job: u64) -> bool {
        let fence = *self.fence.lock().unwrap_or_else(|p| p.into_inner());
        if Instant::now() < fence {
            return true;
        }
        if !self.fenced.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                job,
                "claims not confirmed by the database for {:?} (lease {:?} minus a margin of {:?}): sending nothing more of this job, its unsent recipients are handed back",
                job_ttr() - fence_margin(),
                job_ttr(),
                fence_margin()
            );
        }
        false
    }

    /// Whether the job hit its fence.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extension_answered_after_the_fence_does_not_reopen_it() {
        let asked = Instant::now() - job_ttr();
        let lease = Lease::new(asked);
        assert!(!lease.open(1));
        let now = Instant::now();
        assert!(!lease.extended(now, now));
        assert!(!lease.open(1));
        assert!(lease.is_fenced());
    }

    #[test]
    fn an_extension_in_time_moves_the_fence() {
        let start = Instant::now() - (job_ttr() - fence_margin()) + Duration::from_secs(1);
        let lease = Lease::new(start);
        let now = Instant::now();
        assert!(lease.extended(now, now));
        assert!(lease.open(1));
        // An older extension never moves it back.
        assert!(lease.extended(start, now));
        assert!(lease.open(1));
    }
}
