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

    /// Put a granted lease in the local stock: `count` tokens, the first
    /// conforming `offset_us` from now (negative: already conforming, by the
    /// group's unspent burst), then one every `interval_us`. Every token that
    /// already conforms is usable at once, so a group with tokens to spare is
    /// served at its rate (and burst) from its first message rather than
    /// ramping up from one token per interval; the rest keep their times.
    /// Times are measured from after the lease's round trip: a token due at
    /// once must not look older than TOKEN_EXPIRY on a slow database and be
    /// dropped unspent. Tokens of an earlier lease still held come first.
    pub(super) fn push_granted(&mut self, count: u32, offset_us: i64, interval_us: i64) {
        let (now, count) = (Instant::now(), u64::from(count));
        let step_us = interval_us.max(1);
        let ready = if offset_us > 0 {
            0
        } else {
            (offset_us.unsigned_abs() / step_us as u64 + 1).min(count)
        };
        self.push(now, Duration::ZERO, ready);
        let later_us = offset_us + ready as i64 * step_us;
        let first = now + Duration::from_micros(later_us.max(0) as u64);
        self.push(first, Duration::from_micros(step_us as u64), count - ready);
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

    #[test]
    fn a_lease_with_burst_to_spare_is_usable_at_once_and_the_rest_keeps_its_pace() {
        let before = Instant::now();
        let mut s = Stock::default();
        // Ten tokens 10 ms apart, the first conforming 35 ms ago: four
        // conform already (−35, −25, −15, −5 ms), the fifth in 5 ms.
        s.push_granted(10, -35_000, 10_000);
        let after = Instant::now();
        assert_eq!(s.len(), 10);
        assert!(
            s.nth(3).is_some_and(|t| t <= after),
            "burst not usable at once"
        );
        let fifth = s.nth(4).unwrap_or(before);
        assert!(
            fifth >= before + Duration::from_millis(5),
            "{:?}",
            fifth - before
        );
        assert_eq!(s.nth(9).map(|t| t - fifth), Some(Duration::from_millis(50)));
        // A lease whose first token lies ahead keeps every time.
        let mut s = Stock::default();
        s.push_granted(3, 20_000, 10_000);
        assert!(s
            .nth(0)
            .is_some_and(|t| t >= before + Duration::from_millis(20)));
        // More conforming than granted: all granted are usable at once.
        let mut s = Stock::default();
        s.push_granted(3, -1_000_000, 10_000);
        assert!(s.nth(2).is_some_and(|t| t <= Instant::now()));
    }
}
