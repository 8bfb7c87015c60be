//! The job stage: for each reserved job, check the campaign (unknown →
//! bury, cancelled → delete, paused → release with a growing delay), claim
//! its recipients in the ledger, render and compose their messages, and hand
//! them to the senders. A [`Tracker`] follows the job until every claimed
//! recipient's outcome is durably recorded, then decides the job's fate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lettre::message::Mailbox;
use tokio::sync::{mpsc, OwnedSemaphorePermit, RwLock};
use tokio_util::sync::CancellationToken;

use super::db::Db;
use super::reserve::{Cmd, Incoming};
use crate::mail::{self, Composed};
use crate::queue::{self, JobBody, JOB_TTR};
use crate::store::campaigns::{self, Flags};
use crate::store::deliveries::{self, OutcomeKind, Recorded};
use crate::store::{now_ms, recipients, CampaignState, RecipientStatus, StoreError};
use crate::templates::{self, Context};

/// Priority given to buried jobs (they are inspected by hand anyway).
const BURY_PRIORITY: u32 = 0;
/// A job whose campaign or claim could not be read (database down) comes
/// back after this long.
const DB_RETRY_DELAY: Duration = Duration::from_secs(5);
/// Bounds of the delay a paused campaign's job is released with. It grows
/// with the time the pause has lasted so an hours-long pause does not churn
/// the queue (and beanstalkd's binlog) every few seconds.
const PAUSE_DELAY_MIN: Duration = Duration::from_secs(1);
const PAUSE_DELAY_MAX: Duration = Duration::from_secs(120);
/// First delay before a transient failure is retried; doubles per attempt.
const RETRY_DELAY_BASE: Duration = Duration::from_secs(5);
const RETRY_DELAY_MAX: Duration = Duration::from_secs(600);

/// A campaign's fixed settings, loaded once per worker.
pub struct CampaignInfo {
    pub id: i64,
    pub name: String,
    pub template: String,
    pub subject: String,
    pub from: Mailbox,
    pub priority: u32,
}

#[derive(Clone, Copy)]
struct FlagState {
    flags: Flags,
    paused_since: Option<Instant>,
}

/// Campaign settings and pause/cancel flags, refreshed from the database
/// every [`FLAG_REFRESH`] by [`Campaigns::refresh`].
#[derive(Default)]
pub struct Campaigns {
    info: Mutex<HashMap<i64, Arc<CampaignInfo>>>,
    flags: RwLock<HashMap<i64, FlagState>>,
}

pub const FLAG_REFRESH: Duration = Duration::from_millis(500);

impl Campaigns {
    /// The campaign, loading it on first sight; `None` if it does not exist.
    async fn info(&self, db: &Arc<Db>, id: i64) -> Result<Option<Arc<CampaignInfo>>, StoreError> {
        if let Some(found) = self.info.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Ok(Some(Arc::clone(found)));
        }
        let Some(c) = db.run(move |conn| campaigns::get(conn, id)).await? else {
            return Ok(None);
        };
        let from = mail::parse_from(&c.from_addr).map_err(|_| StoreError::BadValue {
            what: "sender address",
            value: c.from_addr.clone(),
        })?;
        let info = Arc::new(CampaignInfo {
            id,
            name: c.name.clone(),
            template: c.template.clone(),
            subject: c.subject.clone(),
            from,
            priority: queue::priority(c.priority),
        });
        self.info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&info));
        self.set_flags(
            id,
            Flags {
                state: c.state()?,
                paused: c.paused,
            },
        )
        .await;
        Ok(Some(info))
    }

    async fn set_flags(&self, id: i64, flags: Flags) {
        let mut map = self.flags.write().await;
        let paused_since = match map.get(&id) {
            Some(old) if flags.paused => old.paused_since.or(Some(Instant::now())),
            _ if flags.paused => Some(Instant::now()),
            _ => None,
        };
        map.insert(
            id,
            FlagState {
                flags,
                paused_since,
            },
        );
    }

    /// Reload the flags of every campaign this worker has seen.
    pub async fn refresh(&self, db: &Arc<Db>) -> Result<(), StoreError> {
        let ids: Vec<i64> = self.flags.read().await.keys().copied().collect();
        if ids.is_empty() {
            return Ok(());
        }
        for (id, flags) in db.run(move |c| campaigns::flags(c, &ids)).await? {
            self.set_flags(id, flags).await;
        }
        Ok(())
    }

    /// Whether no more mail may go out for this campaign now.
    pub async fn blocked(&self, id: i64) -> bool {
        self.flags
            .read()
            .await
            .get(&id)
            .is_some_and(|f| f.flags.paused || f.flags.state == CampaignState::Cancelled)
    }

    async fn flag_state(&self, id: i64) -> Option<FlagState> {
        self.flags.read().await.get(&id).copied()
    }
}

/// The delay for a paused campaign's job: as long as the pause has lasted,
/// within bounds.
fn pause_delay(since: Option<Instant>) -> Duration {
    since
        .map_or(PAUSE_DELAY_MIN, |s| s.elapsed())
        .clamp(PAUSE_DELAY_MIN, PAUSE_DELAY_MAX)
}

/// The delay before retrying after the given attempt failed transiently.
pub fn retry_delay(attempt: i32) -> Duration {
    let doublings = attempt.clamp(1, 16) as u32 - 1;
    RETRY_DELAY_BASE
        .saturating_mul(1 << doublings)
        .min(RETRY_DELAY_MAX)
}

/// One message on its way to a sender.
pub struct Msg {
    pub tracker: Arc<Tracker>,
    pub recipient_id: i64,
    /// Which try this is (1 for the first).
    pub attempt: i32,
    pub composed: Composed,
    /// Rate groups the message counts against, and its weight in tokens.
    pub rate_groups: Vec<String>,
    pub weight: u32,
}

/// One outcome on its way to the reporter.
pub struct Report {
    pub tracker: Arc<Tracker>,
    pub recipient_id: i64,
    pub attempt: i32,
    pub kind: OutcomeKind,
    /// For a message that went to the relay: one of the worker's
    /// `concurrency` "unrecorded" permits, held until the outcome is
    /// committed. So at any moment at most `concurrency` messages are on the
    /// wire or sent-but-unrecorded: all a `kill -9` can make us send twice.
    pub unrecorded: Option<OwnedSemaphorePermit>,
}

/// What the stages share.
pub struct Shared {
    pub db: Arc<Db>,
    pub campaigns: Campaigns,
    pub cmds: Vec<std::sync::mpsc::Sender<Cmd>>,
    pub to_send: async_channel::Sender<Msg>,
    pub to_report: mpsc::Sender<Report>,
    pub max_attempts: i32,
    pub limiter: crate::ratelimit::Limiter,
    /// `concurrency` permits: a message holds one from before it is sent
    /// until its outcome is committed (see [`Report::unrecorded`]).
    pub unrecorded: Arc<tokio::sync::Semaphore>,
}

impl Shared {
    fn cmd(&self, server: usize, cmd: Cmd) {
        if let Some(tx) = self.cmds.get(server) {
            // A closed channel means the server thread is gone; the job
            // returns to the queue by itself when its connection closes.
            let _ = tx.send(cmd);
        }
    }
}

#[derive(Default)]
struct Progress {
    outstanding: usize,
    /// Highest attempt among recipients left to retry.
    retry_attempt: Option<i32>,
    /// Some recipients were handed back unsent.
    unclaimed: bool,
    /// Some were handed back for lack of rate tokens; try again after this.
    throttled: Option<Duration>,
}

/// Follows one reserved job until all its outcomes are recorded.
pub struct Tracker {
    server: usize,
    job_id: u64,
    pub campaign_id: i64,
    pub token: i64,
    priority: u32,
    /// Another worker holds some recipients until then (ms).
    busy_until: Option<i64>,
    progress: Mutex<Progress>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Cancelled when the job is finished (stops its touch loop).
    done: CancellationToken,
}

impl Tracker {
    /// A message of this job waits for rate tokens for `retry_in`.
    pub fn throttle(&self, retry_in: Duration) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.throttled = Some(p.throttled.map_or(retry_in, |d| d.max(retry_in)));
    }

    /// Note a recorded outcome; returns true when it was the job's last.
    pub fn complete(&self, kind: &OutcomeKind, recorded: Recorded, attempt: i32) -> bool {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if recorded == Recorded::Open {
            match kind {
                OutcomeKind::Unclaim => p.unclaimed = true,
                _ => p.retry_attempt = Some(p.retry_attempt.map_or(attempt, |b| b.max(attempt))),
            }
        }
        p.outstanding = p.outstanding.saturating_sub(1);
        p.outstanding == 0
    }
}

/// Decide the fate of a job whose outcomes are all recorded, tell its server
/// thread, and free its slot.
pub async fn finish(shared: &Shared, t: &Tracker) {
    let (retry_attempt, unclaimed, throttled) = {
        let p = t.progress.lock().unwrap_or_else(|e| e.into_inner());
        (p.retry_attempt, p.unclaimed, p.throttled)
    };
    let flags = shared.campaigns.flag_state(t.campaign_id).await;
    let release = |delay: Duration| Cmd::Release {
        id: t.job_id,
        priority: t.priority,
        delay,
    };
    let cmd = match flags {
        Some(f) if f.flags.state == CampaignState::Cancelled => Cmd::Delete(t.job_id),
        Some(f) if f.flags.paused && (unclaimed || retry_attempt.is_some()) => {
            release(pause_delay(f.paused_since))
        }
        _ => match (retry_attempt, unclaimed, t.busy_until) {
            (Some(a), _, _) => release(retry_delay(a).max(throttled.unwrap_or_default())),
            (None, true, _) => release(throttled.unwrap_or_default()),
            (None, false, Some(until)) => release(Duration::from_millis(
                (until - now_ms()).max(0) as u64 + 1_000,
            )),
            (None, false, None) => Cmd::Delete(t.job_id),
        },
    };
    tracing::debug!(job = t.job_id, ?cmd, "job finished");
    shared.cmd(t.server, cmd);
    t.done.cancel();
    drop(t.permit.lock().unwrap_or_else(|e| e.into_inner()).take());
}

/// A job that passed its checks and whose recipients are claimed.
struct Claimed {
    info: Arc<CampaignInfo>,
    token: i64,
    claim: deliveries::Claim,
    people: Vec<recipients::Recipient>,
}

/// Check a job and claim its recipients, or say what to do with the job
/// instead (bury, delete, release).
async fn prepare(shared: &Shared, id: u64, body: &[u8]) -> Result<Claimed, Cmd> {
    let bury = Cmd::Bury {
        id,
        priority: BURY_PRIORITY,
    };
    let body = JobBody::decode(body).map_err(|e| {
        tracing::warn!(job = id, "burying job: {e}");
        bury
    })?;
    let retry_later = |what: &str, e: StoreError| {
        tracing::warn!(job = id, error = %e, "{what}; job comes back in {DB_RETRY_DELAY:?}");
        Cmd::Release {
            id,
            priority: 0,
            delay: DB_RETRY_DELAY,
        }
    };
    let info = match shared.campaigns.info(&shared.db, body.campaign).await {
        Ok(Some(info)) => info,
        Ok(None) => {
            tracing::warn!(
                job = id,
                "burying job: it names campaign {}, which does not exist",
                body.campaign
            );
            return Err(bury);
        }
        Err(e) => return Err(retry_later("cannot read the campaign", e)),
    };
    if let Some(f) = shared.campaigns.flag_state(info.id).await {
        if f.flags.state == CampaignState::Cancelled {
            tracing::debug!(job = id, "campaign cancelled: deleting job");
            return Err(Cmd::Delete(id));
        }
        if f.flags.paused {
            return Err(Cmd::Release {
                id,
                priority: info.priority,
                delay: pause_delay(f.paused_since),
            });
        }
    }
    let token = rand::random_range(1..i64::MAX);
    let lease = JOB_TTR.as_millis() as i64;
    let campaign_id = info.id;
    let (claim, people) = shared
        .db
        .run(move |c| {
            let claim = deliveries::claim(c, campaign_id, &body.recipients, token, lease)?;
            let owned: Vec<i64> = claim.owned.iter().map(|(rid, _)| *rid).collect();
            let people = recipients::load(c, &owned)?;
            Ok((claim, people))
        })
        .await
        .map_err(|e| retry_later("cannot claim recipients", e))?;
    Ok(Claimed {
        info,
        token,
        claim,
        people,
    })
}

/// Process one reserved job up to handing its messages to the senders.
pub async fn handle(shared: Arc<Shared>, job: Incoming) {
    let Incoming {
        server,
        id,
        body,
        permit,
    } = job;
    let Claimed {
        info,
        token,
        claim,
        people,
    } = match prepare(&shared, id, &body).await {
        Ok(c) => c,
        Err(cmd) => {
            shared.cmd(server, cmd);
            return drop(permit);
        }
    };
    let campaign_id = info.id;

    let tracker = Arc::new(Tracker {
        server,
        job_id: id,
        campaign_id,
        token,
        priority: info.priority,
        busy_until: claim.busy_until,
        progress: Mutex::new(Progress {
            outstanding: claim.owned.len(),
            ..Progress::default()
        }),
        permit: Mutex::new(Some(permit)),
        done: CancellationToken::new(),
    });
    if claim.owned.is_empty() {
        return finish(&shared, &tracker).await;
    }
    tokio::spawn(touch_loop(Arc::clone(&shared), Arc::clone(&tracker)));

    let mut by_id: HashMap<i64, recipients::Recipient> =
        people.into_iter().map(|r| (r.id, r)).collect();
    for &(rid, attempt) in &claim.owned {
        let outcome = match by_id.remove(&rid) {
            None => Err(OutcomeKind::Failed("recipient no longer exists".into())),
            Some(r) => compose_guarded(&info, &r).map(|composed| {
                let domain = r.email.rsplit('@').next().unwrap_or_default();
                Msg {
                    rate_groups: shared.limiter.groups_for(&info.name, domain),
                    weight: message_weight(composed.bytes.len()),
                    tracker: Arc::clone(&tracker),
                    recipient_id: rid,
                    attempt,
                    composed,
                }
            }),
        };
        let sent = match outcome {
            Ok(msg) => shared.to_send.send(msg).await.is_ok(),
            Err(kind) => shared
                .to_report
                .send(Report {
                    tracker: Arc::clone(&tracker),
                    recipient_id: rid,
                    attempt,
                    kind,
                    unrecorded: None,
                })
                .await
                .is_ok(),
        };
        if !sent {
            // The pipeline is shutting down under us; the claims lapse after
            // the TTR and the job returns to the queue when we disconnect.
            return;
        }
    }
}

/// The message a recipient of a campaign would get, exactly as a worker
/// composes it (for `mailsplit preview`).
pub fn preview(
    conn: &mut crate::store::Conn,
    campaign: &str,
    email: Option<&str>,
) -> anyhow::Result<Vec<u8>> {
    let c = campaigns::find(conn, campaign)?;
    let id = match email {
        Some(e) => recipients::find_by_email(conn, e)?
            .ok_or_else(|| crate::cli::UsageError(format!("no recipient {e:?}")))?,
        None => recipients::member_page(conn, c.list_id, 0, 1)?
            .first()
            .map(|(id, _)| *id)
            .ok_or_else(|| {
                crate::cli::UsageError(format!("list of campaign {:?} is empty", c.name))
            })?,
    };
    let r = recipients::load(conn, &[id])?
        .pop()
        .ok_or_else(|| crate::cli::UsageError(format!("no recipient with id {id}")))?;
    let info = CampaignInfo {
        id: c.id,
        name: c.name.clone(),
        template: c.template.clone(),
        subject: c.subject.clone(),
        from: mail::parse_from(&c.from_addr)?,
        priority: queue::priority(c.priority),
    };
    match compose_for(&info, &r) {
        Ok(m) => Ok(m.bytes),
        Err(outcome) => anyhow::bail!("{} would not get a message: {outcome:?}", r.email),
    }
}

/// [`compose_for`], with a panic in a library turned into a failed outcome
/// for that one recipient, so the job's accounting always completes.
fn compose_guarded(
    info: &CampaignInfo,
    r: &recipients::Recipient,
) -> Result<Composed, OutcomeKind> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compose_for(info, r))).unwrap_or_else(
        |_| {
            tracing::error!(
                recipient = r.id,
                "composing the message panicked; recording it as failed"
            );
            Err(OutcomeKind::Failed(
                "internal error while composing the message".into(),
            ))
        },
    )
}

/// Rate tokens one message costs: one, plus one per started 256 KiB, so
/// large messages count for more against a relay's budget.
pub fn message_weight(bytes: usize) -> u32 {
    1 + (bytes / (256 * 1024)) as u32
}

/// Render and compose one recipient's message, or the outcome that stands
/// in for it (skipped when not active, failed when it cannot be built).
fn compose_for(info: &CampaignInfo, r: &recipients::Recipient) -> Result<Composed, OutcomeKind> {
    match r.status() {
        Ok(RecipientStatus::Active) => {}
        Ok(other) => return Err(OutcomeKind::Skipped(other.as_str().to_string())),
        Err(e) => return Err(OutcomeKind::Failed(e.to_string())),
    }
    let attributes: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&r.attributes).unwrap_or_default();
    let fallback_unsubscribe;
    let unsubscribe_url = match attributes.get("unsubscribe_url").and_then(|v| v.as_str()) {
        Some(u) => u,
        None => {
            fallback_unsubscribe = format!("mailto:{}?subject=unsubscribe", info.from.email);
            &fallback_unsubscribe
        }
    };
    let ctx = Context {
        subject: &info.subject,
        name: &r.name,
        email: &r.email,
        attributes: &attributes,
        unsubscribe_url,
    };
    let rendered = templates::render(&info.template, &ctx)
        .map_err(|e| OutcomeKind::Failed(format!("{e:#}")))?;
    let message_id = format!(
        "<{}.{}.mailsplit@{}>",
        info.id,
        r.id,
        info.from.email.domain()
    );
    mail::compose(
        &info.from,
        &info.subject,
        message_id,
        &r.name,
        &r.email,
        rendered.html,
        rendered.text,
    )
    .map_err(|e| OutcomeKind::Failed(e.to_string()))
}

/// While a job is being worked on, touch it on our own clock (beanstalkd
/// does not report DEADLINE_SOON while other jobs are ready, issue 646) and
/// extend its ledger claims to match.
async fn touch_loop(shared: Arc<Shared>, t: Arc<Tracker>) {
    let every = JOB_TTR / 3;
    loop {
        tokio::select! {
            _ = t.done.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        shared.cmd(t.server, Cmd::Touch(t.job_id));
        let (campaign, token) = (t.campaign_id, t.token);
        let lease = JOB_TTR.as_millis() as i64;
        if let Err(e) = shared
            .db
            .run(move |c| deliveries::extend_claims(c, campaign, token, lease))
            .await
        {
            tracing::warn!(job = t.job_id, error = %e, "cannot extend claims");
        }
    }
}
