//! The scheduler between the job stage and the senders: per rate group, a
//! queue of parked messages, as an MTA keeps a queue per destination
//! (Postfix's qmgr, KumoMTA's scheduled queue per domain). A sender asks
//! [`Scheduler::next`] for its next message and gets one whose rate tokens
//! are already taken (for all its groups at once), so no sender ever waits
//! for tokens while other mail could go.
//!
//! A message whose group has no token now is parked in that group's queue
//! (in arrival order). A message whose tokens are not expected within
//! [`MAX_PARK`] (the group is far behind, or limited to a few per minute),
//! or that meets a full park ([`Scheduler::new`]'s bound), is *deferred*;
//! so are the newest parked messages beyond what this worker's measured
//! share of the group sends within [`MAX_PARK_AGE`], and any message parked
//! for [`MAX_PARKED_FOR`]. Deferred means handed back to the ledger
//! unsent and noted on its job, which then puts those recipients into new
//! delayed jobs, one per group (see `fate::finish`). So jobs never stay
//! reserved behind a slow group, and memory stays bounded whatever the
//! backlog.
//!
//! Only one sender schedules at a time (the others queue on the state's
//! lock, in order): each check-then-take of tokens is therefore atomic in
//! this worker, and a token is taken only when a sender is there to spend it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;

use super::flags::Campaigns;
use super::pipeline::{Msg, SendOutcome, Urgent};
use crate::rate::limiter::Limiter;
use crate::store::OutcomeKind;

mod parked;
mod timing;
use parked::{Parked, State};
use timing::{
    horizon, DEFER_EARLY, MAX_BACKLOG_DELAY, MAX_DEFER_DELAY, MAX_SLEEP, MIN_DEFER_DELAY,
    TRIES_PER_QUEUE,
};
pub use timing::{MAX_PARK, MAX_PARKED_FOR, MAX_PARK_AGE};

/// What the scheduler reads of the worker's shared state (see
/// [`super::shared::Shared::schedule`]): the limiter, the campaigns' flags,
/// and the way to the reporter for deferred recipients.
pub struct Context<'a> {
    pub limiter: &'a Limiter,
    pub campaigns: &'a Campaigns,
    pub to_report: &'a mpsc::Sender<SendOutcome>,
}

/// Per group: recipients parked in this worker, and deferred by it into
/// delayed jobs that are not due yet.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub parked: u64,
    pub deferred: u64,
}

pub struct Scheduler {
    input: async_channel::Receiver<Msg>,
    /// Transactional messages: handed out before any campaign message.
    urgent: async_channel::Receiver<Urgent>,
    state: Mutex<State>,
    abort: CancellationToken,
    max_parked: usize,
    epoch: Instant,
    /// Snapshot of the state for the heartbeat (see [`Scheduler::usage`]).
    usage: StdMutex<HashMap<String, Usage>>,
    /// Messages whose tokens are taken, for senders queued on the lock: a
    /// scheduling sender that wakes late (a busy machine) takes every token
    /// then due at once rather than one per turn of the lock.
    ready: StdMutex<VecDeque<Msg>>,
    /// Senders inside [`Scheduler::next`].
    waiting: AtomicUsize,
    /// Messages parked, as of the last scheduling pass.
    parked_now: AtomicUsize,
}

/// A sender's idle time ran out.
struct Idle;

/// The job stage is gone and nothing is parked.
struct Gone;

/// What [`Scheduler::next`] gives a sender.
pub enum Next {
    /// A message, its tokens taken (none after an abort).
    Msg(Msg),
    /// A transactional message, its tokens taken by its handler.
    Urgent(Urgent),
    /// Nothing within the sender's idle time.
    Idle,
    /// The job stage is gone and nothing is parked: no more work.
    Closed,
}

/// What [`Scheduler::next_locked`] found.
enum Out {
    Msg(Msg),
    Urgent(Urgent),
}

enum Admit {
    Go(Msg),
    Held,
}

impl Scheduler {
    /// The worker's abort (the grace is over): the job stage stops
    /// composing when it trips, between messages.
    pub fn abort(&self) -> &CancellationToken {
        &self.abort
    }

    /// Messages come from `input` (the job stage); at most `max_parked` wait
    /// inside at once. After `abort`, messages are handed out without tokens
    /// (the sender hands them back unsent).
    pub fn new(
        (input, urgent): (
            async_channel::Receiver<Msg>,
            async_channel::Receiver<Urgent>,
        ),
        max_parked: usize,
        abort: CancellationToken,
    ) -> Scheduler {
        Scheduler {
            input,
            urgent,
            state: Mutex::new(State::default()),
            abort,
            max_parked: max_parked.max(1),
            epoch: Instant::now(),
            usage: StdMutex::new(HashMap::new()),
            ready: StdMutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
            parked_now: AtomicUsize::new(0),
        }
    }

    /// Parked and deferred recipients per group, as of the last scheduling
    /// pass.
    pub fn usage(&self) -> HashMap<String, Usage> {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The next message to send, its rate tokens taken; `None` once the job
    /// stage is gone and nothing is parked.
    ///
    /// With `idle`, gives up after that long without a message. Not to be
    /// cancelled midway (it may hold a message between two awaits): the
    /// idle time is its own way out.
    pub async fn next(&self, shared: &Context<'_>, idle: Option<Duration>) -> Next {
        if let Ok(u) = self.urgent.try_recv() {
            return Next::Urgent(u);
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let deadline = idle.map(|d| Instant::now() + d);
        let out = self.next_locked(shared, deadline).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match out {
            Ok(Some(Out::Msg(m))) => Next::Msg(m),
            Ok(Some(Out::Urgent(u))) => Next::Urgent(u),
            Ok(None) => Next::Closed,
            Err(Idle) => Next::Idle,
        }
    }

    /// Nothing waits: no message in the channels, parked or ready.
    pub fn is_empty(&self) -> bool {
        self.urgent.is_empty()
            && self.input.is_empty()
            && self.parked_now.load(Ordering::Acquire) == 0
            && self
                .ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// The job stage is gone.
    pub fn is_closed(&self) -> bool {
        self.input.is_closed()
    }

    fn pop_ready(&self) -> Option<Msg> {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Room for messages handed to senders queued on the lock.
    fn ready_room(&self) -> bool {
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner()).len();
        ready + 1 < self.waiting.load(Ordering::Acquire)
    }

    async fn next_locked(
        &self,
        shared: &Context<'_>,
        deadline: Option<Instant>,
    ) -> Result<Option<Out>, Idle> {
        if let Some(m) = self.pop_ready() {
            return Ok(Some(Out::Msg(m)));
        }
        let mut st = self.state.lock().await;
        if let Some(m) = self.pop_ready() {
            return Ok(Some(Out::Msg(m)));
        }
        loop {
            if self.abort.is_cancelled() {
                return Ok(self.after_abort(&mut st).await);
            }
            st.follow_generation(shared.limiter.generation());
            if let Some(m) = self.release_parked(&mut st, shared).await {
                self.publish(&st);
                return Ok(Some(Out::Msg(m)));
            }
            self.sweep(&mut st, shared).await;
            match self.admit_sent(&mut st, shared).await {
                Ok(Some(m)) => {
                    self.publish(&st);
                    return Ok(Some(Out::Msg(m)));
                }
                Ok(None) => {}
                Err(Gone) => return Ok(None),
            }
            self.publish(&st);
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Err(Idle);
            }
            let wake = st.wake_at(now, deadline);
            let open = !self.input.is_closed();
            tokio::select! {
                biased;
                Ok(u) = self.urgent.recv() => return Ok(Some(Out::Urgent(u))),
                m = self.input.recv(), if open => {
                    if let Ok(m) = m {
                        if let Admit::Go(m) = self.admit(&mut st, shared, m).await {
                            self.publish(&st);
                            return Ok(Some(Out::Msg(m)));
                        }
                    }
                }
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = self.abort.cancelled() => {}
            }
        }
    }

    /// After the abort, messages go without tokens (their senders hand
    /// them back unsent): the parked ones first, then whatever comes.
    async fn after_abort(&self, st: &mut State) -> Option<Out> {
        if let Some(m) = st.pop_any() {
            return Some(Out::Msg(m));
        }
        tokio::select! {
            biased;
            Ok(u) = self.urgent.recv() => Some(Out::Urgent(u)),
            m = self.input.recv() => m.ok().map(Out::Msg),
        }
    }

    /// Admit what the job stage has sent meanwhile, until a message may go
    /// now.
    async fn admit_sent(&self, st: &mut State, shared: &Context<'_>) -> Result<Option<Msg>, Gone> {
        loop {
            match self.input.try_recv() {
                Ok(m) => {
                    if let Admit::Go(m) = self.admit(st, shared, m).await {
                        return Ok(Some(m));
                    }
                }
                Err(async_channel::TryRecvError::Empty) => return Ok(None),
                Err(async_channel::TryRecvError::Closed) if st.parked == 0 => return Err(Gone),
                Err(async_channel::TryRecvError::Closed) => return Ok(None),
            }
        }
    }

    /// Give groups whose next token is due their parked messages.
    async fn release_parked(&self, st: &mut State, shared: &Context<'_>) -> Option<Msg> {
        let mut first = None;
        for (_, name) in st.due_queues(Instant::now()) {
            for _ in 0..TRIES_PER_QUEUE {
                let Some(head) = st.queues.get_mut(&name).and_then(|q| q.msgs.front_mut()) else {
                    break;
                };
                regroup(shared, &mut head.msg);
                let (groups, weight, campaign) = (
                    head.msg.rate_groups.clone(),
                    head.msg.weight,
                    head.msg.tracker.campaign_id,
                );
                if shared.campaigns.blocked(campaign).await {
                    if first.is_some() {
                        return first;
                    }
                    // Paused or cancelled: the sender hands it back.
                    return st.take_head(&name).map(|p| p.msg);
                }
                match shared.limiter.try_take(&groups, weight).await {
                    Ok(()) => {
                        st.note_taken(&groups);
                        let Some(p) = st.take_head(&name) else {
                            break;
                        };
                        if !self.hand_out(&mut first, p.msg) {
                            return first;
                        }
                    }
                    Err(b) if b.group == name => {
                        if let Some(q) = st.queues.get_mut(&name) {
                            q.due = Some(b.at);
                        }
                        break;
                    }
                    // Another of its groups is short now: wait there.
                    Err(b) => {
                        if !st.repark_head(&name, b.group, b.at) {
                            break;
                        }
                    }
                }
            }
        }
        first
    }

    /// A message whose tokens are taken: the caller's if it has none yet,
    /// else for a sender queued on the lock. Whether there is room for more.
    fn hand_out(&self, first: &mut Option<Msg>, msg: Msg) -> bool {
        if first.is_none() {
            *first = Some(msg);
        } else {
            self.ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(msg);
        }
        self.ready_room()
    }

    /// Keep in each queue only what is expected to go within
    /// [`MAX_PARK_AGE`] at this worker's measured share of the group: the
    /// newest messages beyond that are deferred (their jobs are then free),
    /// the oldest stay, as they go next. Anything parked longer than
    /// [`MAX_PARKED_FOR`] is deferred whatever the estimate said.
    async fn sweep(&self, st: &mut State, shared: &Context<'_>) {
        let now = Instant::now();
        let names: Vec<String> = st
            .queues
            .iter()
            .filter(|(_, q)| !q.msgs.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let each = st.each(shared, &name);
            let until_due = st
                .queues
                .get(&name)
                .and_then(|q| q.due)
                .map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
            let room = horizon(&name).1.saturating_sub(until_due);
            let keep = if each.is_zero() {
                usize::MAX
            } else {
                // The head always stays: it goes next (a slow group's
                // message back from a delayed job a little early waits
                // here for its token rather than being deferred again).
                ((room.as_secs_f64() / each.as_secs_f64()) as usize).max(1)
            };
            while let Some(q) = st.queues.get_mut(&name) {
                let p = if q.msgs.len() > keep {
                    q.msgs.pop_back()
                } else if q
                    .msgs
                    .front()
                    .is_some_and(|p| p.since + MAX_PARKED_FOR <= now)
                {
                    q.msgs.pop_front()
                } else {
                    break;
                };
                let Some(p) = p else {
                    break;
                };
                st.parked -= 1;
                let delay = st.estimate(shared, &name, now);
                self.defer(st, shared, p.msg, &name, delay).await;
            }
        }
    }

    /// A message from the job stage: send it now, park it, or defer it.
    async fn admit(&self, st: &mut State, shared: &Context<'_>, mut msg: Msg) -> Admit {
        regroup(shared, &mut msg);
        if msg.rate_groups.is_empty() || shared.campaigns.blocked(msg.tracker.campaign_id).await {
            return Admit::Go(msg);
        }
        let blocked = match shared.limiter.try_take(&msg.rate_groups, msg.weight).await {
            Ok(()) => {
                st.note_taken(&msg.rate_groups);
                return Admit::Go(msg);
            }
            Err(b) => b,
        };
        let now = Instant::now();
        let q = st.queues.entry(blocked.group.clone()).or_default();
        if q.msgs.is_empty() || q.due.is_none_or(|d| d < blocked.at) {
            q.due = Some(blocked.at);
        }
        let wait = st.estimate(shared, &blocked.group, now);
        if wait > horizon(&blocked.group).0 || st.parked >= self.max_parked {
            self.defer(st, shared, msg, &blocked.group, wait).await;
        } else if let Some(q) = st.queues.get_mut(&blocked.group) {
            q.msgs.push_back(Parked { msg, since: now });
            st.parked += 1;
        }
        Admit::Held
    }

    /// Hand a message back to the ledger unsent and note on its job that it
    /// is deferred, to come back a little before `wait` is over.
    async fn defer(
        &self,
        st: &mut State,
        shared: &Context<'_>,
        msg: Msg,
        group: &str,
        wait: Duration,
    ) {
        let delay = wait
            .saturating_sub(DEFER_EARLY)
            .clamp(MIN_DEFER_DELAY, MAX_DEFER_DELAY);
        msg.tracker.defer(msg.recipient_id, group, delay);
        let second = (Instant::now() + delay)
            .duration_since(self.epoch)
            .as_secs();
        *st.deferred
            .entry(group.to_string())
            .or_default()
            .entry(second)
            .or_default() += 1;
        let report = SendOutcome {
            tracker: msg.tracker,
            recipient_id: msg.recipient_id,
            attempt: msg.attempt,
            kind: OutcomeKind::Unclaim,
            content_version: None,
            unrecorded: None,
        };
        // A closed reporter means shutdown: the claim lapses after the TTR.
        let _ = shared.to_report.send(report).await;
    }

    /// Refresh the snapshot read by the heartbeat.
    fn publish(&self, st: &State) {
        let now = Instant::now().duration_since(self.epoch).as_secs();
        let mut out: HashMap<String, Usage> = HashMap::new();
        for (name, q) in &st.queues {
            if !q.msgs.is_empty() {
                out.entry(name.clone()).or_default().parked = q.msgs.len() as u64;
            }
        }
        for (name, by_second) in &st.deferred {
            let n: u64 = by_second.range(now..).map(|(_, &c)| u64::from(c)).sum();
            if n > 0 {
                out.entry(name.clone()).or_default().deferred = n;
            }
        }
        *self.usage.lock().unwrap_or_else(|p| p.into_inner()) = out;
        self.parked_now.store(st.parked, Ordering::Release);
    }
}

/// Work out the message's groups again if they changed since.
fn regroup(shared: &Context<'_>, msg: &mut Msg) {
    let generation = shared.limiter.generation();
    if msg.rate_generation != generation {
        msg.rate_groups = shared.limiter.groups_for(&msg.campaign_name, &msg.domain);
        msg.rate_generation = generation;
    }
}
