//! The wire side of a message job: rate tokens, the `sending` marks, the
//! hand-over to the senders' pooled sessions, and the outcomes recorded
//! in groups (see the stage's account in [`super`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::{JobFate, Outcome, DB_RETRY_DELAY};
use crate::mail::reply::Verdict;
use crate::mail::Composed;
use crate::rate::limiter;
use crate::store::messages::{self, Message, MessageStatus};
use crate::store::{messages_sweep, now_ms};
use crate::worker::pipeline::{Delivered, Urgent};
use crate::worker::shared::Shared;

/// A throttled message's job comes back after this (as a campaign's
/// throttled recipients do).
const THROTTLE_RETRY: Duration = Duration::from_secs(1);
/// Delay before the second try after a 4xx; doubled per try, capped.
const FIRST_RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(600);
/// Verdicts of a batch are gathered while the next one comes within this,
/// and recorded together: answers arrive one by one from the senders, and
/// one transaction each would leave the writers queueing for SQLite's
/// lock (a campaign's reporter groups its outcomes so too).
const RECORD_LINGER: Duration = Duration::from_millis(5);
/// Longest wait for rate tokens while holding the claim; beyond it the
/// message goes back to the queue for as long as the tokens are off.
const MAX_TOKEN_WAIT: Duration = Duration::from_secs(5);

/// Mark, hand over and record the ready messages a group at a time: as
/// many as the worker has free on-wire permits (at least one, waited
/// for), each held until its outcome is recorded (see [`Shared::on_wire`]).
pub(super) async fn send_all(
    shared: &Arc<Shared>,
    ready: Vec<Ready>,
    token: i64,
    fate: &mut JobFate,
) {
    let mut ready = ready.into_iter().peekable();
    while ready.peek().is_some() {
        let Ok(first) = Arc::clone(&shared.on_wire).acquire_owned().await else {
            break;
        };
        let mut permits = vec![first];
        while permits.len() < ready.len() {
            match Arc::clone(&shared.on_wire).try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let group: Vec<Ready> = ready.by_ref().take(permits.len()).collect();
        let mut outcomes = Vec::new();
        let started = start_sending(shared, group, token, &mut outcomes, fate).await;
        record(shared, token, outcomes, fate).await;
        deliver(
            shared,
            started.into_iter().zip(permits).collect(),
            token,
            fate,
        )
        .await;
    }
}

/// A composed message with its rate groups, ready for the wire.
pub(super) struct Ready {
    msg: Message,
    composed: Composed,
    groups: Vec<String>,
}

/// Take each message's rate tokens, waiting up to [`MAX_TOKEN_WAIT`] for
/// them; once one cannot have them in time, it and the rest go back to
/// the queue for as long as the tokens are off.
pub(super) async fn take_tokens(
    shared: &Arc<Shared>,
    composed: Vec<(Message, Composed)>,
    outcomes: &mut Vec<Outcome>,
    fate: &mut JobFate,
) -> Vec<Ready> {
    let mut ready = Vec::with_capacity(composed.len());
    let mut off: Option<Duration> = None;
    for (msg, composed) in composed {
        if off.is_some() {
            outcomes.push((msg.id, MessageStatus::Queued, None));
            continue;
        }
        let domain = msg.to_addr.rsplit('@').next().unwrap_or_default();
        let domain = domain.trim_end_matches('>').to_string();
        shared.limiter.resolve(&domain).await;
        let groups = shared.limiter.groups_for("", &domain);
        let weight = limiter::message_weight(composed.bytes.len());
        match shared
            .limiter
            .acquire(&groups, weight, MAX_TOKEN_WAIT)
            .await
        {
            Ok(()) => ready.push(Ready {
                msg,
                composed,
                groups,
            }),
            Err(t) => {
                off = Some(t.retry_in);
                outcomes.push((msg.id, MessageStatus::Queued, None));
            }
        }
    }
    if let Some(wait) = off {
        fate.again_in(wait);
    }
    ready
}

/// Mark the messages `sending` (one transaction): from here a lapsed
/// claim fails them rather than sending them again. Those whose claim was
/// lost meanwhile are dropped (another worker has them).
async fn start_sending(
    shared: &Arc<Shared>,
    ready: Vec<Ready>,
    token: i64,
    outcomes: &mut Vec<Outcome>,
    fate: &mut JobFate,
) -> Vec<Ready> {
    let ids: Vec<i64> = ready.iter().map(|r| r.msg.id).collect();
    match shared
        .db
        .run(move |c| messages::batch::start_sending(c, &ids, token))
        .await
    {
        Ok(ours) => ready
            .into_iter()
            .zip(ours)
            .filter_map(|(r, ours)| ours.then_some(r))
            .collect(),
        Err(_) => {
            outcomes.extend(
                ready
                    .iter()
                    .map(|r| (r.msg.id, MessageStatus::Queued, None)),
            );
            fate.again_in(DB_RETRY_DELAY);
            Vec::new()
        }
    }
}

/// Hand the messages to the senders' pooled sessions (ahead of the
/// campaigns' messages) and record each verdict. Verdicts are recorded in
/// groups: once no further answer came for [`RECORD_LINGER`], the ones
/// gathered are written in one transaction, which also gives back the
/// senders' "unrecorded" permits they hold (a sender waits for one before
/// it sends, so a group is never held for longer).
async fn deliver(
    shared: &Arc<Shared>,
    started: Vec<(Ready, OwnedSemaphorePermit)>,
    token: i64,
    fate: &mut JobFate,
) {
    let mut answers = tokio::task::JoinSet::new();
    for (r, on_wire) in started {
        let (reply, answer) = oneshot::channel();
        let Ready {
            msg,
            composed,
            groups,
        } = r;
        if shared
            .urgent
            .send(Urgent { composed, reply })
            .await
            .is_err()
        {
            fate.again_in(Duration::ZERO);
            let back = vec![(msg.id, MessageStatus::Queued, None)];
            record(shared, token, back, fate).await;
            continue;
        }
        answers.spawn(async move { (msg, groups, answer.await, on_wire) });
    }
    let mut gathered = Vec::new();
    let mut permits = Vec::new();
    loop {
        let next = match tokio::time::timeout(RECORD_LINGER, answers.join_next()).await {
            Ok(next) => next,
            Err(_) => {
                flush(shared, token, &mut gathered, &mut permits, fate).await;
                answers.join_next().await
            }
        };
        let Some(Ok((msg, groups, answer, on_wire))) = next else {
            if next.is_none() {
                break;
            }
            continue;
        };
        let (outcome, permit) = verdict_of(shared, &msg, &groups, answer, fate).await;
        gathered.extend(outcome);
        permits.extend(permit);
        // Held until the outcome is recorded: a `sending` row it is.
        permits.push(on_wire);
    }
    flush(shared, token, &mut gathered, &mut permits, fate).await;
}

/// Record what is gathered, then free the permits that held it.
async fn flush(
    shared: &Arc<Shared>,
    token: i64,
    gathered: &mut Vec<Outcome>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    fate: &JobFate,
) {
    if !gathered.is_empty() {
        record(shared, token, std::mem::take(gathered), fate).await;
    }
    permits.clear();
}

/// A sender's answer for `msg` as its outcome to record (none: whether
/// the relay took it is unknown), and the permit to free once recorded.
async fn verdict_of(
    shared: &Arc<Shared>,
    msg: &Message,
    groups: &[String],
    answer: Result<Delivered, oneshot::error::RecvError>,
    fate: &mut JobFate,
) -> (Option<Outcome>, Option<OwnedSemaphorePermit>) {
    let (verdict, permit) = match answer {
        Ok(Delivered {
            verdict: Some(v),
            unrecorded,
        }) => (v, unrecorded),
        Ok(Delivered { verdict: None, .. }) => {
            fate.again_in(Duration::ZERO);
            return (Some((msg.id, MessageStatus::Queued, None)), None);
        }
        Err(_) => {
            // The sender ended with the message in hand: whether the relay
            // took it is unknown; its claim lapses and it is failed as in
            // doubt, never sent twice.
            fate.again_in(Duration::ZERO);
            return (None, None);
        }
    };
    let outcome = match verdict {
        Verdict::Sent => {
            shared.limiter.success(groups).await;
            (msg.id, MessageStatus::Sent, None)
        }
        Verdict::Permanent(reply) => (msg.id, MessageStatus::Failed, Some(reply.text)),
        // A throttle says nothing about the message (as for a campaign's
        // recipient): tried again soon while the shared rate is cut, and
        // never failed for it, whatever `--max-attempts`.
        Verdict::Transient(reply) if reply.throttles() => {
            shared.limiter.slow_down(groups, &reply.text).await;
            fate.again_in(THROTTLE_RETRY);
            (msg.id, MessageStatus::Queued, Some(reply.text))
        }
        Verdict::Transient(reply) => {
            if msg.attempts >= i64::from(shared.max_attempts) {
                (msg.id, MessageStatus::Failed, Some(reply.text))
            } else {
                fate.again_in(retry_delay(msg.attempts));
                (msg.id, MessageStatus::Queued, Some(reply.text))
            }
        }
    };
    (Some(outcome), permit)
}

/// The wait before try `attempts + 1`.
fn retry_delay(attempts: i64) -> Duration {
    let doublings = attempts.clamp(1, 16) as u32 - 1;
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

/// Record outcomes (one transaction), trying a few times: a message that
/// went out must not be left `sending` by a database hiccup (it would be
/// failed as in doubt once its claim lapses). A message put back to
/// `queued` gets, in the same transaction and while the claim still holds
/// it, when its job comes back (`fate`'s delay so far: the job is released
/// with the shortest of its messages' delays, never a longer one), so the
/// sweep for lost jobs leaves it alone until then.
pub(super) async fn record(
    shared: &Arc<Shared>,
    token: i64,
    outcomes: Vec<Outcome>,
    fate: &JobFate,
) {
    if outcomes.is_empty() {
        return;
    }
    let back: Vec<i64> = outcomes
        .iter()
        .filter(|(_, status, _)| *status == MessageStatus::Queued)
        .map(|(id, _, _)| *id)
        .collect();
    let back = Arc::new(back);
    let delay = fate.again.unwrap_or(Duration::ZERO).as_millis() as i64;
    let outcomes = Arc::new(outcomes);
    for wait in [0u64, 500, 2000, 5000] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let (batch, back) = (Arc::clone(&outcomes), Arc::clone(&back));
        let done = shared
            .db
            .run(move |c| {
                let now = now_ms();
                if back.is_empty() {
                    return messages::batch::record(c, &batch, token, now);
                }
                c.transaction(|c| {
                    messages_sweep::due_again(c, &back, token, now + delay)?;
                    messages::batch::record(c, &batch, token, now)
                })
            })
            .await;
        match done {
            Ok(ours) => {
                for ((mid, status, _), ours) in outcomes.iter().zip(ours) {
                    if ours {
                        tracing::debug!(message = mid, %status, "message recorded");
                    } else {
                        tracing::warn!(
                            message = mid,
                            "message's claim was lost before its outcome was recorded"
                        );
                    }
                }
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot record the messages' outcomes"),
        }
    }
}
