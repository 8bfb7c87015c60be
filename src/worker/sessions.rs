//! How many SMTP sessions this worker may have open to its relay, and the
//! slot each sender holds for its session. Two bounds, both checked before a
//! sender connects (a sender never holds a message while it waits for one):
//!
//! - an **adaptive session count** (1..=`--concurrency`, reached after a
//!   slow start: one more session per quick greeting, and at least one per
//!   [`RAMP_STEP`]), like Postfix's
//!   destination concurrency feedback: a connect that fails (refused,
//!   greeting timeout, `421` at the greeting) brings it down to the
//!   sessions the relay does greet (halves it when it greets none), once per
//!   round of connects; quick greetings grow it back by one per
//!   [`GROW_AFTER`] of them. A
//!   greeting that was slow to come (the relay queued the connection: it is
//!   at its limit) stops the growth. Changes are logged once each;
//! - a **shared connection limit** per relay (`rate set relay:HOST:PORT …
//!   --connections N`), leased through the database (`store::connections`):
//!   a background task renews this worker's lease every [`HEARTBEAT`] with
//!   the sessions it has and wants, and sooner when a sender is waiting.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::HEARTBEAT;
use crate::store::connections;
use crate::store::{now_ms, Db};

/// Quick greetings needed to grow the session count by one.
const GROW_AFTER: u32 = 4;
/// A greeting slower than this means the relay queued the connection.
const SLOW_GREETING: Duration = Duration::from_secs(1);
/// Slow start: the sessions a worker may open at first, and how fast that
/// cap rises: one more per quick greeting (a relay that greets at once is
/// used at full concurrency within a few round trips), and at least one
/// more per step whatever the greetings (so 100 sessions after 2 s).
/// Workers started together then share a relay that greets fewer than all
/// of them (the connects it does not greet add nothing), instead of the
/// first to connect taking every session it greets.
const RAMP_START: usize = 4;
const RAMP_STEP: Duration = Duration::from_millis(20);
/// Shortest time between two lease renewals asked for by waiting senders.
const MIN_RENEWAL: Duration = Duration::from_millis(100);

struct State {
    /// Adaptive session count.
    limit: usize,
    /// Slots taken (connecting or connected).
    active: usize,
    /// Sessions the relay greeted and that are still open.
    live: usize,
    /// Senders waiting for a slot.
    waiting: usize,
    /// What the shared lease allows; `None` without a shared limit.
    allowed: Option<usize>,
    last_shrink: Option<Instant>,
    quick: u32,
    /// When the first slot was asked for (the slow start's origin).
    first_ask: Option<Instant>,
    /// Quick greetings since then (each widens the slow start by one).
    greeted: usize,
}

pub struct Sessions {
    relay: String,
    group: String,
    max: usize,
    ramp_step: Duration,
    state: Mutex<State>,
    /// A slot came free or a bound grew.
    freed: Notify,
    /// A sender waits on the shared limit: renew the lease now.
    renew: Notify,
}

/// One sender's right to a session; dropping it frees the slot.
pub struct Slot {
    sessions: Arc<Sessions>,
    live: bool,
}

impl Sessions {
    pub fn new(relay: &str, concurrency: usize) -> Arc<Sessions> {
        Sessions::with_ramp(relay, concurrency, RAMP_STEP)
    }

    /// `ramp_step` zero: no slow start.
    fn with_ramp(relay: &str, concurrency: usize, ramp_step: Duration) -> Arc<Sessions> {
        Arc::new(Sessions {
            relay: relay.to_string(),
            group: crate::rate_group::Group::Relay(relay.to_string()).to_string(),
            max: concurrency.max(1),
            ramp_step,
            state: Mutex::new(State {
                limit: concurrency.max(1),
                active: 0,
                live: 0,
                waiting: 0,
                allowed: None,
                last_shrink: None,
                quick: 0,
                first_ask: None,
                greeted: 0,
            }),
            freed: Notify::new(),
            renew: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The adaptive session count now.
    pub fn limit(&self) -> usize {
        self.lock().limit
    }

    /// Wait for a free slot; `None` once `done` is cancelled.
    pub async fn acquire(self: &Arc<Self>, done: &CancellationToken) -> Option<Slot> {
        let mut counted = false;
        let slot = loop {
            if done.is_cancelled() {
                break None;
            }
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let (shared_full, ramping) = {
                let mut st = self.lock();
                let shared_ok = st.allowed.is_none_or(|a| st.active < a);
                let first = *st.first_ask.get_or_insert_with(Instant::now);
                let ramp = if self.ramp_step.is_zero() {
                    usize::MAX
                } else {
                    let steps = first.elapsed().as_nanos() / self.ramp_step.as_nanos();
                    let steps = usize::try_from(steps).unwrap_or(usize::MAX);
                    RAMP_START.saturating_add(steps).saturating_add(st.greeted)
                };
                if st.active < st.limit.min(ramp) && shared_ok {
                    st.active += 1;
                    if counted {
                        st.waiting -= 1;
                    }
                    counted = false;
                    break Some(Slot {
                        sessions: Arc::clone(self),
                        live: false,
                    });
                }
                if !counted {
                    st.waiting += 1;
                    counted = true;
                }
                (!shared_ok, st.active >= ramp && st.active < st.limit)
            };
            if shared_full {
                self.renew.notify_one();
            }
            tokio::select! {
                _ = &mut freed => {}
                _ = tokio::time::sleep(self.ramp_step), if ramping => {}
                _ = done.cancelled() => break None,
            }
        };
        if counted {
            self.lock().waiting -= 1;
        }
        slot
    }

    /// The relay greeted a session after `waited`.
    pub fn connected(&self, slot: &mut Slot, waited: Duration) {
        let mut st = self.lock();
        if !slot.live {
            slot.live = true;
            st.live += 1;
        }
        if waited > SLOW_GREETING {
            st.quick = 0;
            return;
        }
        // A waiting sender may open one more session now.
        st.greeted = st.greeted.saturating_add(1);
        let mut wake = st.waiting > 0 && st.greeted < self.max;
        st.quick += 1;
        if st.quick >= GROW_AFTER && st.limit < self.max {
            st.quick = 0;
            st.limit += 1;
            wake = true;
            if st.limit == self.max {
                tracing::info!(relay = %self.relay, sessions = st.limit, "relay takes every session again");
            }
        }
        drop(st);
        if wake {
            self.freed.notify_waiters();
        }
    }

    /// A connect begun at `started` failed (refused, timed out, or the
    /// relay said 421 at the greeting): the session count drops to the
    /// sessions the relay does greet (at least one), or to half when it
    /// greets none of ours. Failures of connects begun before the last
    /// drop belong to the round already answered and change nothing.
    pub fn failed(&self, started: Instant) {
        let mut st = self.lock();
        st.quick = 0;
        if st.last_shrink.is_some_and(|t| started < t) {
            return;
        }
        let was = st.limit;
        st.limit = if st.live > 0 {
            st.live.min(was)
        } else {
            (was / 2).max(1)
        };
        st.last_shrink = Some(Instant::now());
        if st.limit < was {
            tracing::warn!(
                relay = %self.relay,
                sessions = st.limit,
                was,
                "relay refused or did not greet a session: fewer sessions"
            );
        }
    }

    /// Keep this worker's lease on the relay's shared connection limit (if
    /// it has one) until `done`; the lease row is removed at the end.
    /// No session opens before the first renewal has said whether the relay
    /// has a shared limit (one database round trip after the start).
    pub fn start_leasing(self: &Arc<Self>, db: Arc<Db>, done: CancellationToken) -> JoinHandle<()> {
        self.lock().allowed = Some(0);
        let me = Arc::clone(self);
        tokio::spawn(async move { me.lease_loop(db, done).await })
    }

    async fn lease_loop(self: Arc<Self>, db: Arc<Db>, done: CancellationToken) {
        let owner = format!(
            "{}/{}/{}",
            crate::config::host_name(),
            std::process::id(),
            now_ms()
        );
        let mut failing = false;
        loop {
            let (in_use, want) = {
                let st = self.lock();
                (st.active as i64, (st.active + st.waiting) as i64)
            };
            let (group, who) = (self.group.clone(), owner.clone());
            let grant = db
                .run(move |c| connections::lease(c, &group, &who, in_use, want, now_ms()))
                .await;
            match grant {
                Ok(grant) => {
                    if failing {
                        failing = false;
                        tracing::info!(relay = %self.relay, "connection lease renewed again");
                    }
                    let allowed = grant.map(|g| g.allowed.max(0) as usize);
                    let grew = {
                        let mut st = self.lock();
                        let grew = match (st.allowed, allowed) {
                            (Some(a), Some(b)) => b > a,
                            (_, None) => true,
                            (None, Some(_)) => false,
                        };
                        st.allowed = allowed;
                        grew
                    };
                    if grew {
                        self.freed.notify_waiters();
                    }
                }
                // Keep the last grant: the other workers still count it
                // until the lease expires.
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(relay = %self.relay, error = %e, "cannot renew the connection lease");
                }
                Err(_) => {}
            }
            let asked = self.renew.notified();
            tokio::select! {
                _ = done.cancelled() => break,
                _ = tokio::time::sleep(HEARTBEAT) => {}
                _ = asked => tokio::time::sleep(MIN_RENEWAL).await,
            }
        }
        let group = self.group.clone();
        let released = db.run(move |c| connections::release(c, &group, &owner));
        let _ = tokio::time::timeout(Duration::from_secs(3), released).await;
    }

    fn release(&self, live: bool) {
        let mut st = self.lock();
        st.active -= 1;
        if live {
            st.live -= 1;
        }
        drop(st);
        self.freed.notify_waiters();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.sessions.release(self.live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn failures_halve_once_per_round_and_quick_greetings_grow() {
        let s = Sessions::with_ramp("127.0.0.1:25", 100, Duration::ZERO);
        let done = CancellationToken::new();
        let mut slots = Vec::new();
        for _ in 0..30 {
            let mut slot = s.acquire(&done).await.unwrap();
            s.connected(&mut slot, Duration::from_secs(5));
            slots.push(slot);
        }
        let round = Instant::now();
        s.failed(round);
        // The relay greets 30 of ours.
        assert_eq!(s.limit(), 30);
        drop(slots.pop());
        s.failed(round);
        assert_eq!(s.limit(), 30, "a failure of the same round");
        s.failed(Instant::now());
        assert_eq!(s.limit(), 29, "a connect begun after the drop");
        slots.clear();
        s.failed(Instant::now());
        assert_eq!(s.limit(), 14, "none greeted: halved");
        // Slow greetings do not grow it; quick ones do.
        let mut slot = s.acquire(&done).await.unwrap();
        s.connected(&mut slot, Duration::from_secs(2));
        assert_eq!(s.limit(), 14);
        for _ in 0..GROW_AFTER {
            s.connected(&mut slot, Duration::from_millis(5));
        }
        assert_eq!(s.limit(), 15);
    }

    #[tokio::test]
    async fn a_full_count_makes_senders_wait_until_a_slot_frees() {
        let s = Sessions::with_ramp("127.0.0.1:25", 2, Duration::ZERO);
        let done = CancellationToken::new();
        let a = s.acquire(&done).await.unwrap();
        let _b = s.acquire(&done).await.unwrap();
        let waiter = {
            let (s, done) = (Arc::clone(&s), done.clone());
            tokio::spawn(async move { s.acquire(&done).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(a);
        assert!(waiter.await.unwrap());
        done.cancel();
        assert!(s.acquire(&done).await.is_none());
    }

    #[tokio::test]
    async fn each_quick_greeting_opens_room_for_one_more_session() {
        // A step of a minute: time alone would allow nothing more.
        let s = Sessions::with_ramp("127.0.0.1:25", 100, Duration::from_secs(60));
        let done = CancellationToken::new();
        let mut slots = Vec::new();
        for _ in 0..RAMP_START {
            slots.push(s.acquire(&done).await.unwrap());
        }
        let waiter = {
            let (s, done) = (Arc::clone(&s), done.clone());
            tokio::spawn(async move { s.acquire(&done).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "opened beyond the slow start");
        // A slow greeting (the relay queued it) widens nothing...
        s.connected(&mut slots[0], Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "a slow greeting widened the start");
        // ...a quick one lets the waiting sender open its session.
        s.connected(&mut slots[1], Duration::from_millis(1));
        let opened = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(opened, Ok(Ok(true))), "{opened:?}");
    }

    #[tokio::test]
    async fn slow_start_opens_a_few_sessions_then_one_per_step() {
        let s = Sessions::with_ramp("127.0.0.1:25", 100, Duration::from_millis(100));
        let done = CancellationToken::new();
        let started = Instant::now();
        let mut slots = Vec::new();
        for _ in 0..RAMP_START + 2 {
            slots.push(s.acquire(&done).await.unwrap());
        }
        assert!(started.elapsed() >= Duration::from_millis(200));
    }
}
