//! The send stage: `concurrency` sender tasks. A sender first gets a live
//! SMTP session (a slot from [`Sessions`], then connect and greeting), and
//! only then takes the next message, so no message ever waits on a connect
//! that fails or hangs. It keeps the session for up to `--max-per-session`
//! messages, then QUITs and hands its slot back; a session idle for
//! [`IDLE_QUIT`] is closed too. Before each message a sender checks the
//! campaign's cached pause/cancel flag, the abort signal and whether the
//! recipient just left; then it sends and turns the reply into an outcome.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::pipeline::{Delivered, Msg, SendOutcome, Urgent};
use super::schedule::{Next, Scheduler};
use super::sessions::{Sessions, Slot};
use super::shared::Shared;
use crate::mail::{MailError, Relay, Session, Verdict};
use crate::store::OutcomeKind;

const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A throttled recipient's new job is due after this long (beanstalkd
/// counts delays in whole seconds); by then the shared rate is cut.
const THROTTLE_DEFER_DELAY: Duration = Duration::from_secs(1);
/// A session with no message for this long is closed (relays drop idle
/// sessions after a while; a message must not find it dead).
/// Short: an idle session holds one of the relay's processes that a busy
/// worker could use, and reopening one when work comes costs little.
const IDLE_QUIT: Duration = Duration::from_secs(10);
/// How often a sender without a session looks for work.
const WORK_POLL: Duration = Duration::from_millis(50);

/// What one sender works with besides the shared state.
pub struct SenderSetup {
    pub relay: Relay,
    pub sessions: Arc<Sessions>,
    /// Messages per session before QUIT.
    pub max_per_session: usize,
    /// Unsent messages are handed back from now on.
    pub abort: CancellationToken,
    /// Every job is finished: no more work will come.
    pub done: CancellationToken,
}

/// What a sender got when it asked for a session.
enum Opened {
    Session(Box<Session>, Slot),
    /// The connect failed; the sender has waited its backoff.
    Retry,
    /// Hand back whatever comes, without a session.
    Abort,
    /// No more work.
    Done,
}

/// A live session and the slot it holds.
type Held = Option<(Box<Session>, Slot)>;

pub async fn sender(
    shared: Arc<Shared>,
    inbox: Arc<Scheduler>,
    outbox: mpsc::Sender<SendOutcome>,
    setup: SenderSetup,
) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let mut session = if setup.abort.is_cancelled() {
            None
        } else {
            match open(&inbox, &setup, &mut backoff).await {
                Opened::Session(conn, slot) => Some((conn, slot)),
                Opened::Retry => continue,
                Opened::Abort => None,
                Opened::Done => break,
            }
        };
        let closed = on_session(&shared, &inbox, &outbox, &setup, &mut session).await;
        if let Some((mut c, slot)) = session {
            let _ = tokio::time::timeout(Duration::from_secs(2), c.quit()).await;
            drop(slot);
        }
        if closed {
            break;
        }
    }
}

/// Messages on one session (after an abort: none, each handed back) until
/// it has sent `max_per_session`, idles or breaks (then it is dropped
/// without QUIT and `session` is `None`). Returns true when no more work
/// will come or nobody records outcomes any more.
async fn on_session(
    shared: &Shared,
    inbox: &Scheduler,
    outbox: &mpsc::Sender<SendOutcome>,
    setup: &SenderSetup,
    session: &mut Held,
) -> bool {
    let mut tried = 0usize;
    loop {
        if session.is_some() && tried >= setup.max_per_session {
            return false;
        }
        // The one place a sender takes its next message (its rate tokens
        // already taken, see `schedule`).
        let idle = session.is_some().then_some(IDLE_QUIT);
        let msg = match inbox.next(&shared.schedule(), idle).await {
            Next::Msg(msg) => msg,
            Next::Urgent(u) => {
                let conn = session.as_mut().map(|(c, _)| &mut **c);
                tried += usize::from(urgent(shared, &setup.relay, conn, u).await);
                if session.as_ref().is_some_and(|(c, _)| c.has_broken()) {
                    *session = None;
                    return false;
                }
                continue;
            }
            Next::Idle => return false,
            Next::Closed => return true,
        };
        // Wait while `concurrency` messages are already out but unrecorded.
        let Ok(permit) = Arc::clone(&shared.unrecorded).acquire_owned().await else {
            return true;
        };
        let conn = session.as_mut().map(|(c, _)| &mut **c);
        let (kind, on_wire) = deliver(shared, &setup.relay, conn, &msg, &setup.abort).await;
        tried += usize::from(on_wire);
        if outbox.send(outcome(msg, kind, permit)).await.is_err() {
            return true;
        }
        if session.as_ref().is_some_and(|(c, _)| c.has_broken()) {
            // Dropped without QUIT; a new session before the next message.
            *session = None;
            return false;
        }
    }
}

/// `msg`'s outcome for the reporter, holding its unrecorded permit.
fn outcome(msg: Msg, kind: OutcomeKind, permit: OwnedSemaphorePermit) -> SendOutcome {
    SendOutcome {
        tracker: msg.tracker,
        recipient_id: msg.recipient_id,
        attempt: msg.attempt,
        kind,
        content_version: (msg.content_version > 0).then_some(msg.content_version),
        unrecorded: Some(permit),
    }
}

/// Wait for work, then for a session slot, then connect. A connect that
/// fails costs no message (none is taken yet): the slot goes back, the
/// session count may shrink, and the sender waits its backoff.
async fn open(inbox: &Scheduler, setup: &SenderSetup, backoff: &mut Duration) -> Opened {
    let SenderSetup {
        relay,
        sessions,
        abort,
        done,
        ..
    } = setup;
    // No session is opened for nothing (an idle worker holds none).
    while inbox.is_empty() {
        if inbox.is_closed() || done.is_cancelled() {
            return Opened::Done;
        }
        tokio::select! {
            _ = tokio::time::sleep(WORK_POLL) => {}
            _ = abort.cancelled() => return Opened::Abort,
            _ = done.cancelled() => return Opened::Done,
        }
    }
    let slot = tokio::select! {
        s = sessions.acquire(done) => s,
        _ = abort.cancelled() => return Opened::Abort,
    };
    let Some(mut slot) = slot else {
        return Opened::Done;
    };
    let started = Instant::now();
    let connected = tokio::select! {
        c = relay.connect() => c,
        _ = abort.cancelled() => return Opened::Abort,
    };
    match connected {
        Ok(conn) => {
            sessions.connected(&mut slot, started.elapsed());
            *backoff = Duration::from_millis(500);
            Opened::Session(Box::new(conn), slot)
        }
        Err(e) => {
            drop(slot);
            if matches!(e, MailError::Connect { .. }) {
                sessions.failed(started);
            }
            tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), retry_in = ?backoff, "SMTP connect failed");
            tokio::select! {
                _ = tokio::time::sleep(*backoff) => {}
                _ = abort.cancelled() => {}
            }
            *backoff = (*backoff * 2).min(MAX_BACKOFF);
            Opened::Retry
        }
    }
}

/// A transactional message on `conn`, its verdict answered to its
/// handler (none after an abort: the handler puts it back in the queue).
/// Whether it went to the relay.
async fn urgent(shared: &Shared, relay: &Relay, conn: Option<&mut Session>, u: Urgent) -> bool {
    let Urgent { composed, reply } = u;
    let Some(conn) = conn else {
        let _ = reply.send(Delivered {
            verdict: None,
            unrecorded: None,
        });
        return false;
    };
    // Wait while `concurrency` messages are already out but unrecorded.
    let Ok(permit) = Arc::clone(&shared.unrecorded).acquire_owned().await else {
        let _ = reply.send(Delivered {
            verdict: None,
            unrecorded: None,
        });
        return false;
    };
    let verdict = relay.send(conn, &composed).await;
    // A handler gone (its task ended) cannot record the outcome; its claim
    // lapses and the message is failed as in doubt, never sent twice.
    let _ = reply.send(Delivered {
        verdict: Some(verdict),
        unrecorded: Some(permit),
    });
    true
}

/// One message on `conn` (`None` after an abort: handed back). Returns the
/// outcome and whether the message went to the relay.
async fn deliver(
    shared: &Shared,
    relay: &Relay,
    conn: Option<&mut Session>,
    msg: &Msg,
    abort: &CancellationToken,
) -> (OutcomeKind, bool) {
    if abort.is_cancelled() || shared.campaigns.blocked(msg.tracker.campaign_id).await {
        return (OutcomeKind::Unclaim, false);
    }
    // Composed before a `campaign edit` this worker has seen since: handed
    // back, and composed with the new version when its job comes back.
    if shared
        .campaigns
        .outdated(msg.tracker.campaign_id, msg.content_version)
    {
        return (OutcomeKind::Unclaim, false);
    }
    let Some(conn) = conn else {
        return (OutcomeKind::Unclaim, false);
    };
    // The claim may have lapsed (database unreachable): another worker may
    // hold this recipient by now.
    if !msg.tracker.lease.open(msg.tracker.job_id) {
        return (OutcomeKind::Unclaim, false);
    }
    // The message may have been parked for seconds.
    if let Some(status) = shared.optouts.left(msg.recipient_id) {
        return (OutcomeKind::Skipped(status.as_str().to_string()), false);
    }
    let verdict = relay.send(conn, &msg.composed).await;
    (judge(shared, msg, verdict).await, true)
}

/// The outcome of a relay's verdict on `msg`; a success or a throttle also
/// tells the rate limiter.
async fn judge(shared: &Shared, msg: &Msg, verdict: Verdict) -> OutcomeKind {
    match verdict {
        Verdict::Sent => {
            shared.limiter.success(&msg.rate_groups).await;
            OutcomeKind::Sent
        }
        Verdict::Permanent(reply) if reply.says_bad_address() => OutcomeKind::Bounced(reply.text),
        Verdict::Permanent(reply) => OutcomeKind::Failed(reply.text),
        // A throttle says nothing about the recipient: it is deferred (no
        // attempt counted, never failed) while the shared rate is cut.
        Verdict::Transient(reply) if reply.throttles() => {
            // One line per recipient would flood the log in a throttle
            // storm (a line per deferred recipient, thousands a second):
            // the limiter warns once per cut of the shared rate, and each
            // job's line counts its deferred recipients.
            tracing::debug!(%reply, "relay throttles: recipient deferred");
            shared
                .limiter
                .slow_down(&msg.rate_groups, &reply.text)
                .await;
            let group = throttled_group(&msg.rate_groups);
            msg.tracker
                .defer(msg.recipient_id, group, THROTTLE_DEFER_DELAY);
            OutcomeKind::Unclaim
        }
        Verdict::Transient(reply) => OutcomeKind::Retry(reply.text),
    }
}

/// The rate group a throttled recipient is deferred under: its first one
/// that is not the campaign's own.
fn throttled_group(rate_groups: &[String]) -> &str {
    rate_groups
        .iter()
        .find(|g| !crate::rate_group::Group::is_campaign_name(g))
        .map_or("throttled", String::as_str)
}

#[cfg(test)]
mod tests {
    use super::throttled_group;

    #[test]
    fn a_throttled_recipient_is_deferred_under_its_first_group_not_the_campaigns() {
        let groups = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mixed = groups(&["campaign:spring", "domain:example.org", "relay:main"]);
        assert_eq!(throttled_group(&mixed), "domain:example.org");
        assert_eq!(throttled_group(&groups(&["campaign:spring"])), "throttled");
        assert_eq!(throttled_group(&[]), "throttled");
    }
}
