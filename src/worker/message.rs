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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::reserve::{Cmd, Incoming};
use super::shared::Shared;
use crate::compose::content::Cache;
use crate::compose::message::{compose_message, TemplateMail, To};
use crate::compose::Unsendable;
use crate::mail::Composed;
use crate::messages::submit::parse_to;
use crate::queue::message::{Band, MessageJob};
use crate::queue::{job_ttr, BadJob};
use crate::store::messages::{self, Claim, Message, MessageStatus};
use crate::store::{message_templates, now_ms, Conn, StoreError};
use crate::tokens::Identity;

mod wire;
use wire::{record, send_all, take_tokens};

/// A message job whose ledger row could not be read comes back after this.
const DB_RETRY_DELAY: Duration = Duration::from_secs(5);

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
        Ok(m) => run(&shared, (server, id), m.messages, m.band).await,
        Err(BadJob::Foreign(db)) => super::job::foreign(&shared, id, db, &body),
        Err(e) => {
            tracing::warn!(job = id, "burying message job: {e}");
            Cmd::Bury { id, priority: 0 }
        }
    };
    shared.cmd(server, cmd);
    drop(permit);
}

/// Back in `band`, so a retried order confirmation stays ahead of flows.
fn release(id: u64, delay: Duration, band: Band) -> Fate {
    Cmd::Release {
        id,
        priority: band.priority(),
        delay,
    }
}

/// What becomes of a job once each of its messages is handled: deleted,
/// or released to come back when the earliest of its messages that must
/// be tried again is due (those already done are then skipped: their
/// claim answers `Done`).
#[derive(Default)]
struct JobFate {
    again: Option<Duration>,
    /// Messages of the job that are not in the ledger, and whether any is.
    unknown: usize,
    known: bool,
    band: Band,
}

impl JobFate {
    fn again_in(&mut self, delay: Duration) {
        self.again = Some(self.again.map_or(delay, |d| d.min(delay)));
    }

    fn cmd(&self, id: u64) -> Fate {
        match self.again {
            Some(delay) => release(id, delay, self.band),
            // Nothing it names exists: a forged or stale job, kept aside
            // for an operator to look at rather than retried.
            None if self.unknown > 0 && !self.known => Cmd::Bury { id, priority: 0 },
            None => Cmd::Delete(id),
        }
    }
}

/// What became of a claimed message, to record: its id, status and the
/// relay's reply.
type Outcome = messages::batch::Outcome;

/// Claim, send and record the messages of job `id` (reserved on server
/// `server`): a batch's claims in one write transaction and its reads in
/// one read transaction, its sending marks in one, its outcomes recorded
/// in groups, as a campaign job's recipients.
async fn run(shared: &Arc<Shared>, (server, id): (usize, u64), ids: Vec<i64>, band: Band) -> Fate {
    let token = rand::random_range(1..i64::MAX);
    let mut fate = JobFate {
        band,
        ..JobFate::default()
    };
    let mine = match claim(shared, id, ids, token, &mut fate).await {
        Some(mine) if !mine.is_empty() => mine,
        _ => return fate.cmd(id),
    };
    // A slow relay must not let the job's TTR run out under the claims.
    let alive = CancellationToken::new();
    let claimed: Vec<i64> = mine.iter().map(|(m, _)| m.id).collect();
    tokio::spawn(keep_alive(
        Arc::clone(shared),
        (server, id),
        (claimed, token),
        alive.clone(),
    ));
    let _alive = alive.drop_guard();
    let mut outcomes = Vec::new();
    let composed = compose_all(mine, &mut outcomes, &mut fate).await;
    let ready = take_tokens(shared, composed, &mut outcomes, &mut fate).await;
    record(shared, token, outcomes, &fate).await;
    send_all(shared, ready, token, &mut fate).await;
    fate.cmd(id)
}

/// Claim the job's messages and read what composing them takes; `None`
/// when the database could not be asked (the job comes back).
async fn claim(
    shared: &Arc<Shared>,
    id: u64,
    ids: Vec<i64>,
    token: i64,
    fate: &mut JobFate,
) -> Option<Vec<(Message, LoadedFor)>> {
    let lease = job_ttr().as_millis() as i64;
    let (identity, cache) = (shared.identity.clone(), Arc::clone(&shared.templates));
    let asked = ids.clone();
    let claimed = shared
        .db
        .run(move |c| claim_and_read(c, &asked, (token, lease), &identity, &cache))
        .await;
    let claimed = match claimed {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(job = id, error = %e, "cannot claim the messages; job comes back in {DB_RETRY_DELAY:?}");
            fate.again_in(DB_RETRY_DELAY);
            return None;
        }
    };
    let mut mine = Vec::with_capacity(claimed.len());
    for (message, c) in ids.into_iter().zip(claimed) {
        match c {
            Claimed::Mine(m, loaded) => mine.push((*m, *loaded)),
            Claimed::Not(Claim::Mine(_) | Claim::Done) => {}
            Claimed::Not(Claim::Busy(until)) => fate.again_in(Duration::from_millis(
                (until - now_ms()).max(0) as u64 + 100,
            )),
            Claimed::Not(Claim::Unknown) => {
                tracing::warn!(job = id, message, "message job names no such message");
                fate.unknown += 1;
                continue;
            }
        }
        fate.known = true;
    }
    Some(mine)
}

/// Claim `ids` (one write transaction), then read what composing the
/// claimed ones takes (one read transaction for the batch); in the order
/// of `ids`. A failed read leaves each claimed message's reason in words,
/// so it goes back to the queue (see `compose_all`).
fn claim_and_read(
    c: &mut Conn,
    ids: &[i64],
    (token, lease): (i64, i64),
    identity: &Identity,
    cache: &Cache,
) -> Result<Vec<Claimed>, StoreError> {
    let claims = messages::batch::claim(c, ids, token, lease, now_ms())?;
    let mut mine = Vec::new();
    let mut out: Vec<(usize, Claimed)> = Vec::with_capacity(claims.len());
    for (i, claim) in claims.into_iter().enumerate() {
        match claim {
            Claim::Mine(msg) => mine.push((i, *msg)),
            other => out.push((i, Claimed::Not(other))),
        }
    }
    let loaded: Vec<LoadedFor> = match c.reads(|c| {
        let msgs: Vec<&Message> = mine.iter().map(|(_, m)| m).collect();
        read_all(c, &msgs, identity, cache)
    }) {
        Ok(loaded) => loaded.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e.to_string()); mine.len()],
    };
    out.extend(
        mine.into_iter()
            .zip(loaded)
            .map(|((i, m), l)| (i, Claimed::Mine(Box::new(m), Box::new(l)))),
    );
    out.sort_unstable_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, c)| c).collect())
}

/// What [`read_all`] found for a claimed message (`Err`: the database
/// could not be read, said in words).
type LoadedFor = Result<Result<Loaded, Refused>, String>;

/// Compose the claimed messages, on the blocking pool in one hand-off (a
/// render may use its whole budget); what stops one before the wire is
/// its outcome.
async fn compose_all(
    mine: Vec<(Message, LoadedFor)>,
    outcomes: &mut Vec<Outcome>,
    fate: &mut JobFate,
) -> Vec<(Message, Composed)> {
    let mut loaded = Vec::with_capacity(mine.len());
    for (msg, l) in mine {
        match l {
            Ok(Ok(l)) => loaded.push((msg, l)),
            Ok(Err((status, why))) => outcomes.push((msg.id, status, Some(why))),
            Err(e) => {
                tracing::warn!(message = msg.id, error = %e, "cannot read the message's template; it comes back in {DB_RETRY_DELAY:?}");
                outcomes.push((msg.id, MessageStatus::Queued, None));
                fate.again_in(DB_RETRY_DELAY);
            }
        }
    }
    let ids: Vec<i64> = loaded.iter().map(|(m, _)| m.id).collect();
    let composed = tokio::task::spawn_blocking(move || {
        loaded
            .into_iter()
            .map(|(msg, l)| {
                let c = compose(&msg, l);
                (msg, c)
            })
            .collect::<Vec<_>>()
    })
    .await;
    let composed = match composed {
        Ok(c) => c,
        Err(e) => {
            let why = format!("composing failed: {e}");
            outcomes.extend(
                ids.iter()
                    .map(|&id| (id, MessageStatus::Failed, Some(why.clone()))),
            );
            return Vec::new();
        }
    };
    let mut ready = Vec::with_capacity(composed.len());
    for (msg, c) in composed {
        match c {
            Ok(c) => ready.push((msg, c)),
            Err((status, why)) => outcomes.push((msg.id, status, Some(why))),
        }
    }
    ready
}

/// What the claim's call on the database found.
enum Claimed {
    /// This worker holds the message, and what [`read_all`] read for it.
    Mine(Box<Message>, Box<LoadedFor>),
    /// Not this worker's to send.
    Not(Claim),
}

/// What stops a message before the wire: its status and why.
type Refused = (MessageStatus, String);

/// What composing a claimed message takes: its recipient, its template
/// (shared by the batch's messages of that template), and the
/// recipient's id (when the address is on file) and attributes (JSON
/// text).
type Loaded = (Mailbox, Arc<TemplateMail>, (Option<i64>, String));

/// The suppressions again, then the template and the recipient's
/// attributes, for each of `msgs` (the caller holds one read transaction
/// for the batch): each template loaded once, the addresses looked up
/// together.
fn read_all(
    c: &mut Conn,
    msgs: &[&Message],
    identity: &Identity,
    cache: &Cache,
) -> Result<Vec<Result<Loaded, Refused>>, StoreError> {
    let tos: Vec<Result<(Mailbox, String), Refused>> = msgs
        .iter()
        .map(|m| {
            let to = parse_to(&m.to_addr).map_err(|e| (MessageStatus::Failed, e.to_string()))?;
            let key = crate::mailbox::key(to.email.as_ref()).unwrap_or_default();
            Ok((to, key))
        })
        .collect();
    let keys: Vec<String> = tos.iter().flatten().map(|(_, k)| k.clone()).collect();
    let on_file = messages::addressees(c, &keys)?;
    let suppressed = crate::store::suppressions::matching(c, &keys)?;
    let mut templates: HashMap<i64, Result<(Arc<TemplateMail>, bool), String>> = HashMap::new();
    let mut out = Vec::with_capacity(msgs.len());
    for (msg, to) in msgs.iter().zip(tos) {
        let (to, key) = match to {
            Ok(t) => t,
            Err(refused) => {
                out.push(Err(refused));
                continue;
            }
        };
        let template = match templates.get(&msg.template_id) {
            Some(t) => t.clone(),
            None => {
                let t = load_template(c, msg.template_id, identity, cache)?;
                templates.insert(msg.template_id, t.clone());
                t
            }
        };
        let (mail, marketing) = match template {
            Ok(t) => t,
            Err(why) => {
                out.push(Err((MessageStatus::Failed, why)));
                continue;
            }
        };
        let addressee = on_file.get(&key);
        if let Some(why) = addressee.and_then(|a| a.suppressed(marketing)) {
            out.push(Err((MessageStatus::Suppressed, why.to_string())));
            continue;
        }
        if let Some(why) = suppressed.get(&key) {
            out.push(Err((MessageStatus::Suppressed, why.clone())));
            continue;
        }
        let recipient = addressee.map_or((None, "{}".to_string()), |a| {
            (Some(a.id), a.attributes.clone())
        });
        out.push(Ok((to, mail, recipient)));
    }
    Ok(out)
}

/// Template `id` ready to compose with, and whether it is of the
/// marketing stream; `Err` says why its messages fail.
fn load_template(
    c: &mut Conn,
    id: i64,
    identity: &Identity,
    cache: &Cache,
) -> Result<Result<(Arc<TemplateMail>, bool), String>, StoreError> {
    let Some(t) = message_templates::by_id(c, id)? else {
        return Ok(Err("its template was removed".into()));
    };
    let marketing = t.stream == message_templates::Stream::Marketing;
    Ok(TemplateMail::load_cached(c, t, identity, cache)
        .map(|mail| (Arc::new(mail), marketing))
        .map_err(|e| e.to_string()))
}

/// Compose one message (on the blocking pool: a render may use its
/// whole budget).
fn compose(
    msg: &Message,
    (to, mail, (recipient, attributes)): Loaded,
) -> Result<Composed, Refused> {
    let data: Value = serde_json::from_str(&msg.data).unwrap_or(Value::Object(Map::new()));
    let attributes = serde_json::from_str(&attributes).unwrap_or_default();
    let to = To {
        mailbox: &to,
        attributes,
        recipient,
    };
    compose_message(&mail, msg.id, &to, &data).map_err(|e| match e {
        Unsendable::Invalid(why) => (MessageStatus::Failed, why),
        Unsendable::Inactive(s) => (MessageStatus::Suppressed, format!("the address is {s}")),
    })
}

/// Every third of the TTR, extend the messages' claims and, once the
/// database confirmed any, touch their job, until `done`. Claims no
/// longer ours, or a database that does not answer, stop the touching:
/// the job goes back when its TTR runs out, as its claims lapse.
async fn keep_alive(
    shared: Arc<Shared>,
    (server, id): (usize, u64),
    (messages, token): (Vec<i64>, i64),
    done: CancellationToken,
) {
    let every = job_ttr() / 3;
    let messages = Arc::new(messages);
    loop {
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let lease = job_ttr().as_millis() as i64;
        let ids = Arc::clone(&messages);
        let extended = shared
            .db
            .run(move |c| messages::batch::extend_claim(c, &ids, token, lease, now_ms()))
            .await;
        match extended {
            Ok(true) if !done.is_cancelled() => shared.cmd(server, Cmd::Touch(id)),
            Ok(_) => return,
            Err(e) => {
                return tracing::warn!(job = id, error = %e, "cannot extend the messages' claims; their job is no longer touched")
            }
        }
    }
}
