//! The job stage: for each reserved job, check it (signature and database,
//! then the campaign: unknown → bury (deleted → delete), cancelled →
//! delete, paused → release with a growing delay, not started → release
//! until its start), claim its recipients in the ledger, compose their
//! messages and hand them to the senders. From then on a
//! [`Tracker`](super::tracker::Tracker) follows the job to its fate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

mod composing;
mod gates;

use composing::{compose_batch, inline, sign_batch};
pub(super) use gates::foreign;
use gates::{check_flags, unknown_campaign};

use super::fate::finish;
use super::flags::CampaignInfo;
use super::lease::Lease;
use super::pipeline::{Msg, SendOutcome};
use super::reserve::{Cmd, Incoming};
use super::shared::Shared;
use super::touch::touch_loop;
use super::tracker::{Progress, Tracker};
use crate::compose::Unsendable;
use crate::queue::{job_ttr, BadJob, JobBody};
use crate::rate::limiter;
use crate::store::deliveries::{self, OutcomeKind};
use crate::store::{recipients, suppressions, StoreError};

/// Priority given to buried jobs (they are inspected by hand anyway).
const BURY_PRIORITY: u32 = 0;
/// Priority of a campaign job sent back after a database error: urgent,
/// but never in the transactional messages' band.
const RETRY_PRIORITY: u32 = crate::queue::CAMPAIGN_PRIORITY_MIN;
/// A job whose campaign or claim could not be read (database down) comes
/// back after this long.
const DB_RETRY_DELAY: Duration = Duration::from_secs(5);
/// A job of another database that cannot be moved to its own tube goes
/// back for its own workers; this worker meets it again at most this often.
const FOREIGN_DELAY: Duration = Duration::from_secs(30);
/// A job that passed its checks and whose recipients are claimed.
struct Claimed {
    info: Arc<CampaignInfo>,
    token: i64,
    /// When the claim was asked for: its lease counts from then.
    asked: Instant,
    claim: deliveries::Claim,
    people: Vec<recipients::Recipient>,
    /// Of `people`, those on the suppression list, with the reason.
    suppressed: HashMap<i64, String>,
    /// A/B test: each claimed recipient's variant, and until when the
    /// job's held-back recipients wait (see [`super::ab`]).
    variants: Arc<HashMap<i64, i64>>,
    held_until: Option<i64>,
}

/// Check a job and claim its recipients, or say what to do with the job
/// instead (bury, delete, release).
async fn prepare(shared: &Shared, id: u64, body: &[u8]) -> Result<Claimed, Cmd> {
    let mut body = decode(shared, id, body)?;
    let info = match shared
        .campaigns
        .info(&shared.db, &shared.identity, body.campaign)
        .await
    {
        Ok(Some(info)) => info,
        Ok(None) => return Err(unknown_campaign(shared, id, body.campaign).await),
        Err(e) => return Err(retry_later(id, "cannot read the campaign", e)),
    };
    check_flags(shared, id, &info).await?;
    let ab = ab_split(shared, id, &info, &mut body).await?;
    let named = body.recipients.len();
    let asked = Instant::now();
    let token = rand::random_range(1..i64::MAX);
    let (
        deliveries::JobClaim {
            claim,
            people,
            members,
        },
        suppressed,
    ) = claim_recipients(shared, &info, body.recipients, token, ab.variants.clone())
        .await
        .map_err(|e| retry_later(id, "cannot claim recipients", e))?;
    if members < named {
        tracing::warn!(
            job = id,
            campaign = %info.mail.name,
            ignored = named - members,
            "job names recipients that are not on the campaign's list (or do not exist, or twice): ignoring them, neither sent nor counted"
        );
    }
    Ok(Claimed {
        info,
        token,
        asked,
        claim,
        people,
        suppressed,
        variants: Arc::new(ab.variants),
        held_until: ab.held_until,
    })
}

/// The job's body, or: a job of another database goes to its own tube, an
/// unreadable one is buried.
fn decode(shared: &Shared, id: u64, body: &[u8]) -> Result<JobBody, Cmd> {
    match JobBody::decode(body, &shared.identity) {
        Ok(body) => Ok(body),
        Err(BadJob::Foreign(db)) => Err(foreign(shared, id, db, body)),
        Err(e) => {
            tracing::warn!(job = id, "burying job: {e}");
            Err(Cmd::Bury {
                id,
                priority: BURY_PRIORITY,
            })
        }
    }
}

/// A job whose database read failed comes back soon, urgent.
fn retry_later(id: u64, what: &str, e: StoreError) -> Cmd {
    tracing::warn!(job = id, error = %e, "{what}; job comes back in {DB_RETRY_DELAY:?}");
    Cmd::Release {
        id,
        priority: RETRY_PRIORITY,
        delay: DB_RETRY_DELAY,
    }
}

/// An A/B test narrows the job to its recipients due now (the rest wait
/// for the decision); a job with none of them goes back until then.
async fn ab_split(
    shared: &Shared,
    id: u64,
    info: &CampaignInfo,
    body: &mut JobBody,
) -> Result<super::ab::Split, Cmd> {
    let Some(plan) = &info.ab else {
        return Ok(super::ab::Split::default());
    };
    let split = super::ab::split(&shared.db, plan, info.mail.id, &body.recipients)
        .await
        .map_err(|e| retry_later(id, "cannot read the A/B test", e))?;
    if let (true, Some(until)) = (split.claim.is_empty(), split.held_until) {
        // Nobody of the sample: back once, at the decision.
        return Err(Cmd::Release {
            id,
            priority: info.priority,
            delay: super::ab::held_delay(until),
        });
    }
    body.recipients = split.claim.clone();
    Ok(split)
}

/// Claim the job's recipients in the ledger, set their A/B variants and
/// find which of them are suppressed, in one database call.
async fn claim_recipients(
    shared: &Shared,
    info: &CampaignInfo,
    recipients: Vec<i64>,
    token: i64,
    groups_of: HashMap<i64, i64>,
) -> Result<(deliveries::JobClaim, HashMap<i64, String>), StoreError> {
    let lease = job_ttr().as_millis() as i64;
    let (campaign_id, list_id) = (info.mail.id, info.mail.list_id);
    let keep = crate::compose::attributes_needed(&info.mail);
    shared
        .db
        .run(move |c| {
            // Only members of the campaign's list are claimed, whatever the
            // job names: an id that does not exist or belongs to another
            // list is neither sent nor counted.
            let claimed = deliveries::claim_job(
                c,
                campaign_id,
                list_id,
                &recipients,
                token,
                lease,
                keep.as_deref(),
            )?;
            let groups = super::ab::groups(&groups_of, &claimed.claim.owned);
            crate::store::ab::set_variants(c, campaign_id, token, &groups)?;
            // The suppression list as of now (an entry added after
            // enqueue still applies): one lookup for the whole batch.
            let suppressed = suppressed_among(c, &claimed.people)?;
            Ok::<_, StoreError>((claimed, suppressed))
        })
        .await
}

/// Which of `people` the suppression list names (address or domain), by
/// recipient id, with the reason.
fn suppressed_among(
    c: &mut crate::store::Conn,
    people: &[recipients::Recipient],
) -> Result<HashMap<i64, String>, StoreError> {
    // An empty list (most installations) needs no identity keys either.
    if people.is_empty() || !suppressions::may_hold_any(c)? {
        return Ok(HashMap::new());
    }
    let keys: Vec<(i64, String)> = people
        .iter()
        .map(|r| {
            let key = crate::mailbox::key(&r.email).unwrap_or_else(|_| r.email.to_lowercase());
            (r.id, key)
        })
        .collect();
    let all: Vec<String> = keys.iter().map(|(_, k)| k.clone()).collect();
    let found = suppressions::look_up(c, &all)?;
    Ok(keys
        .into_iter()
        .filter_map(|(rid, k)| found.get(&k).map(|why| (rid, why.clone())))
        .collect())
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
        asked,
        claim,
        people,
        suppressed,
        variants,
        held_until,
    } = match prepare(&shared, id, &body).await {
        Ok(c) => c,
        Err(cmd) => {
            shared.cmd(server, cmd);
            return drop(permit);
        }
    };

    let tracker = Arc::new(Tracker {
        server,
        job_id: id,
        campaign_id: info.mail.id,
        token,
        priority: info.priority,
        busy_until: claim.busy_until,
        progress: Mutex::new(Progress::new(people.len())),
        permit: Mutex::new(Some(permit)),
        done: CancellationToken::new(),
        lease: Lease::new(asked),
        held_until,
    });
    if people.is_empty() {
        return finish(&shared, &tracker).await;
    }
    tokio::spawn(touch_loop(Arc::clone(&shared), Arc::clone(&tracker)));

    prime_limiter(&shared, info.mail.id, &people).await;
    // `people` holds exactly the owned recipients that exist, and the job's
    // count is theirs, so each gets one outcome and the count closes.
    let attempts: HashMap<i64, i32> = claim.owned.iter().copied().collect();
    let (people, held): (Vec<_>, Vec<_>) = people
        .into_iter()
        .partition(|r| !suppressed.contains_key(&r.id));
    if !report_suppressed(&shared, &tracker, &attempts, &suppressed, held).await {
        return;
    }
    let job = Job {
        shared: &shared,
        tracker: &tracker,
        attempts: &attempts,
        variants: &variants,
    };
    compose_and_hand_over(&job, info, people).await;
}

/// Tell the rate limiter about the campaign's groups and the job's domains
/// before its first message.
async fn prime_limiter(shared: &Shared, campaign_id: i64, people: &[recipients::Recipient]) {
    // A `campaign:` group set just before `enqueue` must be known before
    // this campaign's first message (later changes: every refresh).
    if let Err(e) = shared.limiter.know_campaign(campaign_id).await {
        tracing::warn!(error = %e, "cannot read rate groups");
    }
    shared
        .limiter
        .look_up(people.iter().map(|r| domain_of(&r.email)));
}

/// What the batches of one job share.
struct Job<'a> {
    shared: &'a Shared,
    tracker: &'a Arc<Tracker>,
    attempts: &'a HashMap<i64, i32>,
    variants: &'a Arc<HashMap<i64, i64>>,
}

/// Give each suppressed recipient its outcome now (skipped, with the
/// reason), and no message.
/// False when the pipeline is closed.
async fn report_suppressed(
    shared: &Shared,
    tracker: &Arc<Tracker>,
    attempts: &HashMap<i64, i32>,
    suppressed: &HashMap<i64, String>,
    held: Vec<recipients::Recipient>,
) -> bool {
    for r in held {
        let why = suppressed.get(&r.id).cloned().unwrap_or_default();
        let attempt = attempts.get(&r.id).copied().unwrap_or(1);
        let outcome = SendOutcome {
            tracker: Arc::clone(tracker),
            recipient_id: r.id,
            attempt,
            kind: OutcomeKind::Skipped(why),
            content_version: None,
            unrecorded: None,
        };
        if shared.to_report.send(outcome).await.is_err() {
            return false;
        }
    }
    true
}

/// Compose the job's messages batch by batch and hand them to the senders;
/// after an abort, hand the rest back unsent.
async fn compose_and_hand_over(
    job: &Job<'_>,
    info: Arc<CampaignInfo>,
    people: Vec<recipients::Recipient>,
) {
    let Job {
        shared,
        tracker,
        attempts,
        variants,
    } = *job;
    let mut people = people.into_iter().peekable();
    while people.peek().is_some() {
        if shared.scheduler.abort().is_cancelled() {
            // The grace is over: no more renders; the rest go back unsent
            // as the senders hand theirs back.
            let rest: Vec<i64> = people.map(|r| r.id).collect();
            hand_back(shared, tracker, attempts, &rest).await;
            return;
        }
        // The campaign as of the last refresh: a `dkim delete` or a new key
        // applies from the next batch on, also within a long job.
        let info = shared
            .campaigns
            .current(info.mail.id)
            .unwrap_or_else(|| Arc::clone(&info));
        let take = if inline(&info) {
            1
        } else {
            sign_batch(&shared.to_send)
        };
        let batch: Vec<recipients::Recipient> = people.by_ref().take(take).collect();
        let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
        let composed = compose_batch(shared, &info, variants, batch).await;
        // Those an abort left unrendered (the end of the batch).
        let unrendered = ids.get(composed.len()..).unwrap_or_default().to_vec();
        for (rid, email, composed) in composed {
            let attempt = attempts.get(&rid).copied().unwrap_or(1);
            if !hand_over(shared, tracker, &info, (rid, &email), attempt, composed).await {
                // The pipeline is shutting down under us; the claims lapse
                // after the TTR and the job returns to the queue when we
                // disconnect.
                return;
            }
        }
        if !hand_back(shared, tracker, attempts, &unrendered).await {
            return;
        }
    }
}

/// Hand recipients back unsent (their attempt does not count), as the
/// senders do after an abort. False when the pipeline is closed.
async fn hand_back(
    shared: &Shared,
    tracker: &Arc<Tracker>,
    attempts: &HashMap<i64, i32>,
    rids: &[i64],
) -> bool {
    for &rid in rids {
        let outcome = SendOutcome {
            tracker: Arc::clone(tracker),
            recipient_id: rid,
            attempt: attempts.get(&rid).copied().unwrap_or(1),
            kind: OutcomeKind::Unclaim,
            content_version: None,
            unrecorded: None,
        };
        if shared.to_report.send(outcome).await.is_err() {
            return false;
        }
    }
    true
}

/// How many DKIM-signed messages to compose in the next hand-off: up to
/// Hand one recipient's composed message to the senders, or its outcome
/// (skipped, failed) to the reporter. False when the pipeline is closed.
async fn hand_over(
    shared: &Shared,
    tracker: &Arc<Tracker>,
    info: &CampaignInfo,
    (rid, email): (i64, &str),
    attempt: i32,
    composed: Result<crate::mail::Composed, Unsendable>,
) -> bool {
    let outcome = match composed {
        Ok(composed) => {
            let domain = domain_of(email).to_string();
            // An `mx:` group may take the domain: its MX answer first.
            shared.limiter.resolve(&domain).await;
            let rate_generation = shared.limiter.generation();
            Ok(Msg {
                rate_groups: shared.limiter.groups_for(&info.mail.name, &domain),
                weight: limiter::message_weight(composed.bytes.len()),
                campaign_name: info.mail.name.clone(),
                domain,
                rate_generation,
                tracker: Arc::clone(tracker),
                recipient_id: rid,
                attempt,
                content_version: info.mail.content_version,
                composed,
            })
        }
        Err(Unsendable::Inactive(status)) => Err(OutcomeKind::Skipped(status.as_str().to_string())),
        Err(Unsendable::Invalid(why)) => Err(OutcomeKind::Failed(why)),
    };
    match outcome {
        Ok(msg) => shared.to_send.send(msg).await.is_ok(),
        Err(kind) => shared
            .to_report
            .send(SendOutcome {
                tracker: Arc::clone(tracker),
                recipient_id: rid,
                attempt,
                kind,
                content_version: None,
                unrecorded: None,
            })
            .await
            .is_ok(),
    }
}

/// The domain of an address (after its last `@`).
fn domain_of(email: &str) -> &str {
    email.rsplit('@').next().unwrap_or_default()
}
