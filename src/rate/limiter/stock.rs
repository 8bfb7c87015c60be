//! A worker's local stock of leased tokens in one group, kept as runs: a
//! lease grants `count` tokens conforming `step` apart from `first` on,
//! and that is one [`Run`] however large `count` is. Nothing here is
//! allocated per token, so memory does not follow the rate an operator
//! types: a `rate set` of 10¹²/s costs what 1/s does.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// `count` tokens, token `i` conforming at `first + i × step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: Instant,
    step: Duration,
    count: u64,
}

impl Run {
    fn at(&self, i: u64) -> Instant {
        let nanos = (self.step.as_nanos() as u64).saturating_mul(i);
        self.first + Duration::from_nanos(nanos)
    }

    /// Drop the first `n` (≤ count) tokens.
    fn advance(&mut self, n: u64) {
        self.first = self.at(n);
        self.count -= n;
    }
}

/// Tokens in time order (a later lease's tokens come after the earlier
/// ones: see [`Stock::push`]).
#[derive(Debug, Default)]
pub(super) struct Stock {
    runs: VecDeque<Run>,
    len: u64,
}

impl Stock {
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// When token `n` (from 0) conforms, if there are that many.
    pub(super) fn nth(&self, mut n: u64) -> Option<Instant> {
        for run in &self.runs {
            if n < run.count {
                return Some(run.at(n));
            }
            n -= run.count;
        }
        None
    }

    /// The last token's time.
    pub(super) fn last(&self) -> Option<Instant> {
        self.runs.back().map(|r| r.at(r.count - 1))
    }

    /// Spend the first `n` tokens (all of them if there are fewer).
    pub(super) fn take(&mut self, mut n: u64) {
        while n > 0 {
            let Some(front) = self.runs.front_mut() else {
                break;
            };
            let k = n.min(front.count);
            front.advance(k);
            self.len -= k;
            n -= k;
            if front.count == 0 {
                self.runs.pop_front();
            }
        }
    }

    /// Drop every token conforming before `cutoff`.
    pub(super) fn drop_before(&mut self, cutoff: Instant) {
        while let Some(front) = self.runs.front_mut() {
            let late = cutoff.saturating_duration_since(front.first);
            if late.is_zero() {
                break;
            }
            // Tokens i with first + i·step < cutoff: i·step < late.
            let step = front.step.as_nanos();
            let gone = if step == 0 {
                front.count
            } else {
                let n = late.as_nanos().div_ceil(step);
                u64::try_from(n).unwrap_or(u64::MAX).min(front.count)
            };
            front.advance(gone);
            self.len -= gone;
            if front.count > 0 {
                break;
            }
            self.runs.pop_front();
        }
    }

    /// Add `count` tokens, the first at `first` (or one `step` after the
    /// last one held, if that is later), then one every `step`.
    pub(super) fn push(&mut self, first: Instant, step: Duration, count: u64) {
        if count == 0 {
            return;
        }
        let first = self.last().map_or(first, |b| first.max(b + step));
        self.runs.push_back(Run { first, step, count });
        self.len += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn runs_behave_like_a_list_of_times() {
        let t0 = Instant::now();
        let mut s = Stock::default();
        s.push(t0, 10 * MS, 5); // 0, 10, 20, 30, 40
        s.push(t0, 10 * MS, 3); // after the last: 50, 60, 70
        assert_eq!(s.len(), 8);
        assert_eq!(s.nth(0), Some(t0));
        assert_eq!(s.nth(5), Some(t0 + 50 * MS));
        assert_eq!(s.nth(8), None);
        assert_eq!(s.last(), Some(t0 + 70 * MS));
        s.take(2);
        assert_eq!((s.len(), s.nth(0)), (6, Some(t0 + 20 * MS)));
        // Tokens before 35 ms (20 and 30) go; 40 stays.
        s.drop_before(t0 + 35 * MS);
        assert_eq!((s.len(), s.nth(0)), (4, Some(t0 + 40 * MS)));
        // A cutoff past a whole run drops into the next.
        s.drop_before(t0 + 55 * MS);
        assert_eq!((s.len(), s.nth(0)), (2, Some(t0 + 60 * MS)));
        s.take(10);
        assert_eq!((s.len(), s.nth(0), s.last()), (0, None, None));
    }

    #[test]
    fn a_huge_lease_is_one_run() {
        let t0 = Instant::now();
        let mut s = Stock::default();
        s.push(t0, Duration::from_nanos(1), u64::from(u32::MAX));
        assert_eq!(s.runs.len(), 1);
        s.take(1_000_000_000);
        assert_eq!(s.len(), u64::from(u32::MAX) - 1_000_000_000);
        s.drop_before(t0 + Duration::from_secs(60));
        assert_eq!(s.len(), 0);
        // Tokens all at once (a group deleted meanwhile).
        s.push(t0, Duration::ZERO, 3);
        s.drop_before(t0 + MS);
        assert_eq!(s.len(), 0);
    }
}
