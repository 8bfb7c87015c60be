//! The scheduler's own state: per rate group, the queue of messages
//! parked for tokens and when the group's next token is due; this
//! worker's measured share of each group; and the recipients deferred
//! into delayed jobs, counted until they are due.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::super::pipeline::Msg;
use super::{Context, MAX_BACKLOG_DELAY, MAX_PARKED_FOR, MAX_SLEEP};

pub(super) struct Parked {
    pub(super) msg: Msg,
    pub(super) since: Instant,
}

/// The window a worker's share of a group is measured over.
const METER_WINDOW: Duration = Duration::from_secs(1);

/// Tokens this worker took per group lately: its share of a group that
/// other workers use too, for estimating how long a parked message waits.
pub(super) struct Meter {
    pub(super) start: Instant,
    pub(super) count: u32,
    /// When this worker last took a token of the group.
    pub(super) last: Instant,
    /// Tokens per second over the last full window while messages were
    /// parked for the group; `None` when unknown.
    pub(super) rate: Option<f64>,
}

impl Meter {
    fn new(now: Instant) -> Meter {
        Meter {
            start: now,
            count: 0,
            last: now,
            rate: None,
        }
    }

    /// A token taken at `now`, while messages were parked for the group
    /// (`backlogged`) or not.
    fn note(&mut self, now: Instant, backlogged: bool) {
        // A gap longer than a window (the group had no token for anyone:
        // a warm-up day's budget spent, a slow group's next token) says
        // nothing of this worker's share: a window across it would read
        // as a tiny share, and the sweep would defer every parked message
        // just as the tokens come back.
        if now.duration_since(self.last) >= METER_WINDOW {
            self.start = now;
            self.count = 0;
        }
        self.last = now;
        self.count += 1;
        let elapsed = now.duration_since(self.start);
        if elapsed >= METER_WINDOW {
            // Only a window with a backlog says what this worker gets.
            if backlogged {
                self.rate = Some(f64::from(self.count) / elapsed.as_secs_f64());
            }
            self.start = now;
            self.count = 0;
        }
    }
}

#[derive(Default)]
pub(super) struct Queue {
    pub(super) msgs: VecDeque<Parked>,
    /// When the group's next token is due, as last seen.
    pub(super) due: Option<Instant>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) queues: HashMap<String, Queue>,
    pub(super) meters: HashMap<String, Meter>,
    pub(super) parked: usize,
    pub(super) generation: u64,
    /// Recipients deferred per group, by the second (since `epoch`) at which
    /// they are due: counted in `status` until then.
    pub(super) deferred: HashMap<String, BTreeMap<u64, u32>>,
}

impl State {
    /// Groups changed (rate generation `generation`): look at every queue
    /// again, forget shares measured under the old rates.
    pub(super) fn follow_generation(&mut self, generation: u64) {
        if generation != self.generation {
            self.generation = generation;
            self.meters.clear();
            for q in self.queues.values_mut() {
                q.due = None;
            }
        }
    }

    /// When the scheduler must look again: the next queue due, a parked
    /// message's time limit, the caller's deadline, or `MAX_SLEEP` from now.
    pub(super) fn wake_at(&self, now: Instant, deadline: Option<Instant>) -> Instant {
        let mut wake = now + MAX_SLEEP;
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        for q in self.queues.values().filter(|q| !q.msgs.is_empty()) {
            wake = wake.min(q.due.unwrap_or(now));
            if let Some(p) = q.msgs.front() {
                wake = wake.min(p.since + MAX_PARKED_FOR);
            }
        }
        wake
    }

    /// The groups with parked messages whose next token is due at `now`
    /// (or not known), with that time, the longest due first.
    pub(super) fn due_queues(&self, now: Instant) -> Vec<(Instant, String)> {
        let mut due: Vec<(Instant, String)> = self
            .queues
            .iter()
            .filter(|(_, q)| !q.msgs.is_empty() && q.due.is_none_or(|d| d <= now))
            .map(|(n, q)| (q.due.unwrap_or(now), n.clone()))
            .collect();
        due.sort();
        due
    }

    /// Move the head of `from`'s queue to `group`'s, whose next token is due
    /// `at` (if nothing waits there yet); false when `from` has none.
    pub(super) fn repark_head(&mut self, from: &str, group: String, at: Instant) -> bool {
        let Some(p) = self.take_head(from) else {
            return false;
        };
        let other = self.queues.entry(group).or_default();
        if other.msgs.is_empty() {
            other.due = Some(at);
        }
        other.msgs.push_back(p);
        self.parked += 1;
        true
    }

    pub(super) fn take_head(&mut self, name: &str) -> Option<Parked> {
        let p = self.queues.get_mut(name)?.msgs.pop_front()?;
        self.parked -= 1;
        Some(p)
    }

    pub(super) fn pop_any(&mut self) -> Option<Msg> {
        let name = self
            .queues
            .iter()
            .find(|(_, q)| !q.msgs.is_empty())
            .map(|(n, _)| n.clone())?;
        self.take_head(&name).map(|p| p.msg)
    }

    pub(super) fn note_taken(&mut self, groups: &[String]) {
        let now = Instant::now();
        for g in groups {
            let backlogged = self.queues.get(g).is_some_and(|q| !q.msgs.is_empty());
            self.meters
                .entry(g.clone())
                .or_insert_with(|| Meter::new(now))
                .note(now, backlogged);
        }
    }

    /// Time between two messages of `group` at this worker: the configured
    /// interval, or the share measured lately if slower.
    pub(super) fn each(&self, shared: &Context<'_>, group: &str) -> Duration {
        let configured = shared.limiter.interval(group).unwrap_or_default();
        // A group whose next token is far off is caught by its due time;
        // a pause of the whole worker (a slow database round trip) must not
        // read as a tiny share and defer everything parked.
        let measured = match self.meters.get(group).and_then(|m| m.rate) {
            Some(r) if r > 0.0 => Duration::from_secs_f64(1.0 / r),
            _ => Duration::ZERO,
        };
        configured.max(measured)
    }

    /// How long a message joining `group`'s queue now would wait: until the
    /// group's next token, plus one share of the group per message ahead.
    pub(super) fn estimate(&self, shared: &Context<'_>, group: &str, now: Instant) -> Duration {
        let q = self.queues.get(group);
        let ahead = q.map_or(0, |q| q.msgs.len()) as u32;
        let until_due = q
            .and_then(|q| q.due)
            .map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        until_due + (self.each(shared, group) * ahead).min(MAX_BACKLOG_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_without_tokens_does_not_read_as_a_tiny_share() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Meter::new(t0);
        // A warm-up day: 120 tokens over 1.2 s, then its budget is spent
        // until the next day, 4.8 s later.
        for i in 0..120 {
            m.note(t0 + ms(10 * i), true);
        }
        let day = m.rate.unwrap_or(0.0);
        assert!((90.0..=110.0).contains(&day), "{day}");
        m.note(t0 + ms(6_000), true);
        m.note(t0 + ms(6_010), true);
        let rate = m.rate.unwrap_or(0.0);
        assert!(rate > 50.0, "the next day starts at a share of {rate}/s");
        // Steady takes still measure the share, and a window without a
        // backlog leaves it alone.
        for i in 0..200 {
            m.note(t0 + ms(6_020 + 20 * i), true);
        }
        let steady = m.rate.unwrap_or(0.0);
        assert!((45.0..=55.0).contains(&steady), "{steady}");
        for i in 0..100 {
            m.note(t0 + ms(10_100 + 100 * i), false);
        }
        assert_eq!(m.rate, Some(steady));
    }
}
