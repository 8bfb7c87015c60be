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

/// Tokens this worker took per group lately: its share of a group that
/// other workers use too, for estimating how long a parked message waits.
pub(super) struct Meter {
    pub(super) start: Instant,
    pub(super) count: u32,
    /// Tokens per second over the last full window while messages were
    /// parked for the group; `None` when unknown.
    pub(super) rate: Option<f64>,
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
            let m = self.meters.entry(g.clone()).or_insert(Meter {
                start: now,
                count: 0,
                rate: None,
            });
            m.count += 1;
            let elapsed = now.duration_since(m.start);
            if elapsed >= Duration::from_secs(1) {
                // Only a window with a backlog says what this worker gets.
                if backlogged {
                    m.rate = Some(f64::from(m.count) / elapsed.as_secs_f64());
                }
                m.start = now;
                m.count = 0;
            }
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
