//! The message stage: a transactional message's job (see
//! [`crate::queue::message`]) is claimed in the `messages` ledger, checked
//! against the suppressions again (an address may have bounced since the
//! submit), composed and DKIM-signed on the blocking pool, and handed, under
//! the shared rate limits, to a sender (see [`super::send`]), which puts it
//! ahead of every campaign message on one of its pooled sessions: within
//! `--concurrency` and the relay's connection limit, with no connect of its
//! own. While a slow relay holds it, its claim is extended and its job
//! touched. Then it is recorded: `sent` / `failed` with the relay's
//! reply; a 4xx goes back to `queued` and the job comes back later, with a
//! growing delay, up to `--max-attempts`. Each message goes on the wire at
//! most once: it is marked `sending` before, and a claim that lapses there
//! is failed, never sent again (see [`crate::store::messages`]).

use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::pipeline::{Delivered, Urgent};
use super::reserve::{Cmd, Incoming};
use super::shared::Shared;
use crate::compose::content::Cache;
use crate::compose::message::{compose_message, TemplateMail, To};
use crate::compose::Unsendable;
use crate::mail::reply::Verdict;
use crate::mail::Composed;
use crate::messages::submit::parse_to;
use crate::queue::message::{MessageJob, MESSAGE_PRIORITY};
use crate::queue::{job_ttr, BadJob};
use crate::rate::limiter;
use crate::store::messages::{self, Claim, Message, MessageStatus};
use crate::store::{message_templates, now_ms, Conn, StoreError};
use crate::tokens::Identity;

/// A message job whose ledger row could not be read comes back after this.
const DB_RETRY_DELAY: Duration = Duration::from_secs(5);
/// Delay before the second try after a 4xx; doubled per try, capped.
const FIRST_RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(600);
/// Longest wait for rate tokens while holding the claim; beyond it the
/// message goes back to the queue for as long as the tokens are off.
const MAX_TOKEN_WAIT: Duration = Duration::from_secs(5);

/// What one message's handling ends in: the job's fate.
type Fate = Cmd;

/// Handle one reserved message job.
pub async fn handle(shared: Arc<Shared>, job: Incoming) {
    let Incoming {
        server,
        id,
        body,
        permit,
    } = job;
    let cmd = match MessageJob::decode(&body, &shared.identity) {
        Ok(m) => run(&shared, (server, id), m.message).await,
        Err(BadJob::Foreign(db)) => super::job::foreign(&shared, id, db, &body),
        Err(e) => {
            tracing::warn!(job = id, "burying message job: {e}");
            Cmd::Bury { id, priority: 0 }
        }
    };
    shared.cmd(server, cmd);
    drop(permit);
}

fn release(id: u64, delay: Duration) -> Fate {
    Cmd::Release {
        id,
        priority: MESSAGE_PRIORITY,
        delay,
    }
}

/// Claim, send and record message `message` of job `id` (reserved on
/// server `server`).
async fn run(shared: &Arc<Shared>, (server, id): (usize, u64), message: i64) -> Fate {
    let token = rand::random_range(1..i64::MAX);
    let lease = job_ttr().as_millis() as i64;
    let (identity, cache) = (shared.identity.clone(), Arc::clone(&shared.templates));
    // The claim and the reads for the message in one call on the
    // connection: one trip to the blocking pool instead of two.
    let claimed = shared
        .db
        .run(move |c| {
            Ok(match messages::claim(c, message, token, lease, now_ms())? {
                Claim::Mine(msg) => {
                    let loaded = load(c, &msg, &identity, &cache);
                    Claimed::Mine(msg, Box::new(loaded))
                }
                other => Claimed::Not(other),
            })
        })
        .await;
    let (msg, loaded) = match claimed {
        Ok(Claimed::Mine(m, loaded)) => (*m, *loaded),
        Ok(Claimed::Not(Claim::Mine(_) | Claim::Done)) => return Cmd::Delete(id),
        Ok(Claimed::Not(Claim::Busy(until))) => {
            let wait = (until - now_ms()).max(0) as u64 + 100;
            return release(id, Duration::from_millis(wait));
        }
        Ok(Claimed::Not(Claim::Unknown)) => {
            tracing::warn!(job = id, message, "burying message job: no such message");
            return Cmd::Bury { id, priority: 0 };
        }
        Err(e) => {
            tracing::warn!(job = id, error = %e, "cannot claim the message; job comes back in {DB_RETRY_DELAY:?}");
            return release(id, DB_RETRY_DELAY);
        }
    };
    // A slow relay must not let the job's TTR run out under the claim.
    let alive = CancellationToken::new();
    tokio::spawn(keep_alive(
        Arc::clone(shared),
        (server, id),
        (msg.id, token),
        alive.clone(),
    ));
    let _alive = alive.drop_guard();
    let ready = match loaded {
        Ok(Ok(loaded)) => compose(&msg, loaded).await,
        Ok(Err(refused)) => Err(refused),
        Err(e) => {
            tracing::warn!(job = id, error = %e, "cannot read the message's template; job comes back in {DB_RETRY_DELAY:?}");
            finish(shared, (msg.id, token), MessageStatus::Queued, None).await;
            return release(id, DB_RETRY_DELAY);
        }
    };
    match ready {
        Ok(composed) => send(shared, id, (msg, token), composed).await,
        Err((status, why)) => {
            finish(shared, (msg.id, token), status, Some(why)).await;
            Cmd::Delete(id)
        }
    }
}

/// What the claim's call on the database found.
enum Claimed {
    /// This worker holds the message, and what [`load`] read for it.
    Mine(
        Box<Message>,
        Box<Result<Result<Loaded, Refused>, StoreError>>,
    ),
    /// Not this worker's to send.
    Not(Claim),
}

/// What stops a message before the wire: its status and why.
type Refused = (MessageStatus, String);

/// What composing a claimed message takes: its recipient, its template,
/// and the recipient's id (when the address is on file) and attributes
/// (JSON text).
type Loaded = (Mailbox, TemplateMail, (Option<i64>, String));

/// Suppressions again, then the template and the recipient's attributes
/// read (in one read transaction).
fn load(
    c: &mut Conn,
    msg: &Message,
    identity: &Identity,
    cache: &Cache,
) -> Result<Result<Loaded, Refused>, StoreError> {
    c.reads(|c| read(c, msg, identity, cache))
}

fn read(
    c: &mut Conn,
    msg: &Message,
    identity: &Identity,
    cache: &Cache,
) -> Result<Result<Loaded, Refused>, StoreError> {
    let to = match parse_to(&msg.to_addr) {
        Ok(to) => to,
        Err(e) => return Ok(Err((MessageStatus::Failed, e.to_string()))),
    };
    let key = crate::mailbox::key(to.email.as_ref()).unwrap_or_default();
    let Some(t) = message_templates::by_id(c, msg.template_id)? else {
        return Ok(Err((
            MessageStatus::Failed,
            "its template was removed".into(),
        )));
    };
    let marketing = t.stream == message_templates::Stream::Marketing;
    if let Some(why) = messages::suppression(c, &key, marketing)? {
        return Ok(Err((MessageStatus::Suppressed, why.to_string())));
    }
    if let Some(why) = crate::store::suppressions::reason_for(c, &key)? {
        return Ok(Err((MessageStatus::Suppressed, why)));
    }
    let recipient = messages::recipient_of_key(c, &key)?;
    Ok(match TemplateMail::load_cached(c, t, identity, cache) {
        Ok(mail) => Ok((to, mail, recipient)),
        Err(e) => Err((MessageStatus::Failed, e.to_string())),
    })
}

/// Compose the message, on the blocking pool: a render may use its whole
/// budget.
async fn compose(
    msg: &Message,
    (to, mail, (recipient, attributes)): Loaded,
) -> Result<Composed, Refused> {
    let data: Value = serde_json::from_str(&msg.data).unwrap_or(Value::Object(Map::new()));
    let id = msg.id;
    let composed = tokio::task::spawn_blocking(move || {
        let attributes = serde_json::from_str(&attributes).unwrap_or_default();
        let to = To {
            mailbox: &to,
            attributes,
            recipient,
        };
        compose_message(&mail, id, &to, &data)
    })
    .await
    .unwrap_or_else(|e| Err(Unsendable::Invalid(format!("composing failed: {e}"))));
    composed.map_err(|e| match e {
        Unsendable::Invalid(why) => (MessageStatus::Failed, why),
        Unsendable::Inactive(s) => (MessageStatus::Suppressed, format!("the address is {s}")),
    })
}

/// Take the rate tokens, mark the message `sending`, hand it to the relay
/// and record the verdict.
async fn send(shared: &Arc<Shared>, id: u64, (msg, token): (Message, i64), m: Composed) -> Fate {
    let domain = msg.to_addr.rsplit('@').next().unwrap_or_default();
    let domain = domain.trim_end_matches('>').to_string();
    shared.limiter.resolve(&domain).await;
    let groups = shared.limiter.groups_for("", &domain);
    let weight = limiter::message_weight(m.bytes.len());
    if let Err(t) = shared
        .limiter
        .acquire(&groups, weight, MAX_TOKEN_WAIT)
        .await
    {
        finish(shared, (msg.id, token), MessageStatus::Queued, None).await;
        return release(id, t.retry_in);
    }
    let (mid, db) = (msg.id, Arc::clone(&shared.db));
    match db
        .run(move |c| messages::start_sending(c, mid, token))
        .await
    {
        Ok(true) => {}
        Ok(false) => return Cmd::Delete(id),
        Err(_) => {
            finish(shared, (msg.id, token), MessageStatus::Queued, None).await;
            return release(id, DB_RETRY_DELAY);
        }
    }
    // On a sender's pooled session, ahead of the campaigns' messages.
    let (reply, answer) = oneshot::channel();
    let urgent = Urgent { composed: m, reply };
    if shared.urgent.send(urgent).await.is_err() {
        finish(shared, (msg.id, token), MessageStatus::Queued, None).await;
        return release(id, Duration::ZERO);
    }
    let (verdict, _unrecorded) = match answer.await {
        Ok(Delivered {
            verdict: Some(v),
            unrecorded,
        }) => (v, unrecorded),
        Ok(Delivered { verdict: None, .. }) => {
            finish(shared, (msg.id, token), MessageStatus::Queued, None).await;
            return release(id, Duration::ZERO);
        }
        Err(_) => {
            // The sender ended with the message in hand: whether the relay
            // took it is unknown; its claim lapses and it is failed as in
            // doubt, never sent twice.
            return release(id, Duration::ZERO);
        }
    };
    match verdict {
        Verdict::Sent => {
            shared.limiter.success(&groups).await;
            finish(shared, (msg.id, token), MessageStatus::Sent, None).await;
            Cmd::Delete(id)
        }
        Verdict::Permanent(reply) => {
            finish(
                shared,
                (msg.id, token),
                MessageStatus::Failed,
                Some(reply.text),
            )
            .await;
            Cmd::Delete(id)
        }
        Verdict::Transient(reply) => {
            if reply.throttles() {
                shared.limiter.slow_down(&groups, &reply.text).await;
            }
            if msg.attempts >= i64::from(shared.max_attempts) {
                finish(
                    shared,
                    (msg.id, token),
                    MessageStatus::Failed,
                    Some(reply.text),
                )
                .await;
                return Cmd::Delete(id);
            }
            finish(
                shared,
                (msg.id, token),
                MessageStatus::Queued,
                Some(reply.text),
            )
            .await;
            release(id, retry_delay(msg.attempts))
        }
    }
}

/// Every third of the TTR, extend the message's claim and, once the
/// database confirmed it, touch its job, until `done`. A claim that is no
/// longer ours, or a database that does not answer, stops the touching: the
/// job goes back when its TTR runs out, as its claim lapses.
async fn keep_alive(
    shared: Arc<Shared>,
    (server, id): (usize, u64),
    claim: (i64, i64),
    done: CancellationToken,
) {
    let every = job_ttr() / 3;
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let lease = job_ttr().as_millis() as i64;
        let extended = shared
            .db
            .run(move |c| messages::extend_claim(c, claim, lease, now_ms()))
            .await;
        match extended {
            Ok(true) if !done.is_cancelled() => shared.cmd(server, Cmd::Touch(id)),
            Ok(_) => return,
            Err(e) => {
                return tracing::warn!(job = id, error = %e, "cannot extend the message's claim; its job is no longer touched")
            }
        }
    }
}

/// The wait before try `attempts + 1`.
fn retry_delay(attempts: i64) -> Duration {
    let doublings = attempts.clamp(1, 16) as u32 - 1;
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

/// Record an outcome, trying a few times: a message that went out must
/// not be left `sending` by a database hiccup (it would be failed as
/// in doubt once its claim lapses).
async fn finish(
    shared: &Arc<Shared>,
    (mid, token): (i64, i64),
    status: MessageStatus,
    reply: Option<String>,
) {
    for wait in [0u64, 500, 2000, 5000] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let reply = reply.clone();
        let done = shared
            .db
            .run(move |c| messages::record(c, (mid, token), status, reply.as_deref(), now_ms()))
            .await;
        match done {
            Ok(true) => return tracing::debug!(message = mid, %status, "message recorded"),
            Ok(false) => {
                return tracing::warn!(
                    message = mid,
                    "message's claim was lost before its outcome was recorded"
                )
            }
            Err(e) => {
                tracing::warn!(message = mid, error = %e, "cannot record the message's outcome")
            }
        }
    }
}
