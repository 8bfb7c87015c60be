//! The deliverer every worker and `serve` run: once a [`TICK`], it marks
//! campaigns seen done (their `campaign.finished` event), then, for each
//! webhook due with events waiting whose lease it can take, POSTs batches
//! of the oldest events until the outbox is empty, a try fails (the next
//! one waits a doubling delay) or the round's bound is reached.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{rfc3339, Precision};
use hyper::body::Bytes;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{http, sign, Delivery, BATCH, MAX_RETRY_DELAY, POST_TIMEOUT};
use crate::store::webhooks::{self as store, Pending, Target};
use crate::store::{now_ms, outbox, Db, StoreError};

/// How often the deliverer looks for work.
pub const TICK: Duration = Duration::from_secs(1);
/// How long a deliverer holds a webhook without renewing its lease: a
/// crashed one's webhooks pass to another process after this.
pub const LEASE: Duration = Duration::from_secs(60);
/// Batches to one webhook per round, so that one busy webhook does not
/// hold the others up for long.
const BATCHES_PER_ROUND: usize = 20;
/// How often outbox rows of removed webhooks are swept.
const ORPHAN_SWEEP: Duration = Duration::from_secs(60);

/// Deliver until `stop`, then give up this process's leases.
pub async fn run(db: Arc<Db>, settings: Delivery, stop: CancellationToken) {
    let owner = format!(
        "{}:{}:{:08x}",
        crate::config::host_name(),
        std::process::id(),
        rand::random::<u32>()
    );
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut swept = Instant::now();
    let mut warned: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let result = round(&db, &settings, &owner, &stop).await;
        let result = match result {
            Ok(()) if swept.elapsed() >= ORPHAN_SWEEP => {
                swept = Instant::now();
                db.run(|c| outbox::delete_orphans(c).map(drop)).await
            }
            other => other,
        };
        if let Err(e) = result {
            // Once a minute at most: a database outage is logged by others.
            if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(error = %e, "webhook delivery: database error; trying again");
                warned = Some(Instant::now());
            }
        }
    }
    let owner_done = owner.clone();
    if let Err(e) = db.run(move |c| store::release(c, &owner_done)).await {
        tracing::debug!(error = %e, "cannot release webhook leases (they expire)");
    }
}

/// One round: campaigns seen done, then every webhook due.
async fn round(
    db: &Arc<Db>,
    settings: &Delivery,
    owner: &str,
    stop: &CancellationToken,
) -> Result<(), StoreError> {
    let now = now_ms();
    db.run(move |c| outbox::finish_campaigns(c, now).map(drop))
        .await?;
    let me = owner.to_string();
    let due = db.run(move |c| store::due(c, &me, now)).await?;
    for id in due {
        if stop.is_cancelled() {
            break;
        }
        deliver_webhook(db, settings, owner, id, stop).await?;
    }
    Ok(())
}

/// Batches to one webhook while this process holds its lease, there are
/// events and the receiver takes them.
async fn deliver_webhook(
    db: &Arc<Db>,
    settings: &Delivery,
    owner: &str,
    id: i64,
    stop: &CancellationToken,
) -> Result<(), StoreError> {
    for _ in 0..BATCHES_PER_ROUND {
        let now = now_ms();
        let me = owner.to_string();
        let until = now + LEASE.as_millis() as i64;
        let Some(target) = db
            .run(move |c| store::lease(c, id, &me, now, until))
            .await?
        else {
            return Ok(());
        };
        let events = db.run(move |c| store::batch(c, id, BATCH)).await?;
        if events.is_empty() {
            return Ok(());
        }
        let full = events.len() as i64 == BATCH;
        let taken = tokio::select! {
            taken = post_batch(db, settings, &target, &events) => taken?,
            // Stopping: the batch stays in the outbox (a receiver that
            // took it gets it again: at least once).
            _ = stop.cancelled() => return Ok(()),
        };
        if !taken || !full {
            return Ok(());
        }
    }
    Ok(())
}

/// POST one batch and record what came of it; true if the receiver took it.
async fn post_batch(
    db: &Arc<Db>,
    settings: &Delivery,
    target: &Target,
    events: &[Pending],
) -> Result<bool, StoreError> {
    let id = target.id;
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    let sent = match url::Url::parse(&target.url) {
        Ok(url) => {
            let body = Bytes::from(body(events));
            let t = now_ms() / 1000;
            let signature = sign(&target.secret, t, &body);
            http::post(&url, &signature, body, POST_TIMEOUT, target.allow_local)
                .await
                .map_err(|e| e.to_string())
        }
        Err(e) => Err(format!("bad URL: {e}")),
    };
    let now = now_ms();
    match sent {
        Ok(()) => {
            db.run(move |c| store::delivered(c, id, &ids, now)).await?;
            Ok(true)
        }
        Err(error) => {
            let delay = retry_delay(settings.retry_base, target.attempts + 1);
            let next = now + delay.as_millis() as i64;
            let before = now - settings.give_up.as_millis() as i64;
            tracing::info!(webhook = id, %error, retry_in = ?delay, "webhook delivery failed");
            let shown = error.clone();
            let dropped = db
                .run(move |c| store::attempt_failed(c, id, &shown, now, next, before))
                .await?;
            if dropped > 0 {
                tracing::warn!(webhook = id, dropped, %error, "webhook events given up");
            }
            Ok(false)
        }
    }
}

/// The delay before try `n + 1` after `n` failures in a row: the base,
/// doubled for each failure after the first, at most [`MAX_RETRY_DELAY`].
pub fn retry_delay(base: Duration, failures: i64) -> Duration {
    let doublings = failures.saturating_sub(1).clamp(0, 20) as u32;
    base.saturating_mul(1 << doublings).min(MAX_RETRY_DELAY)
}

/// One event as the receiver gets it.
#[derive(Serialize)]
struct EventOut<'a> {
    /// The same for every delivery of this event to this webhook: a
    /// receiver deduplicates on it (a batch whose answer was lost comes
    /// again).
    id: i64,
    #[serde(rename = "type")]
    kind: &'static str,
    /// Left out of a message's events, which name the message instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    campaign: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<i64>,
    email: Option<&'a str>,
    at: String,
    /// The link a `clicked` event is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
}

#[derive(Serialize)]
struct Body<'a> {
    events: Vec<EventOut<'a>>,
}

/// `{"events":[{"id","type","campaign","email","at","url"?},…]}`, `at`
/// RFC 3339 UTC.
fn body(events: &[Pending]) -> Vec<u8> {
    let events = events
        .iter()
        .map(|e| EventOut {
            id: e.id,
            kind: e.kind.as_str(),
            campaign: e.message.is_none().then_some(e.campaign.as_deref()),
            message: e.message,
            email: e
                .email
                .as_deref()
                .or(e.message_to.as_deref().map(bare_address)),
            at: rfc3339(e.at, Precision::Millis),
            url: e.url.as_deref(),
        })
        .collect();
    // Serializing plain strings into a Vec cannot fail.
    serde_json::to_vec(&Body { events }).unwrap_or_default()
}

/// The address inside `Name <address>`, or the text as it is.
fn bare_address(to: &str) -> &str {
    match (to.rfind('<'), to.rfind('>')) {
        (Some(a), Some(b)) if a < b => &to[a + 1..b],
        _ => to,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_up_to_the_cap() {
        let base = Duration::from_secs(5);
        assert_eq!(retry_delay(base, 1), base);
        assert_eq!(retry_delay(base, 2), base * 2);
        assert_eq!(retry_delay(base, 4), base * 8);
        assert_eq!(retry_delay(base, 60), MAX_RETRY_DELAY);
    }

    #[test]
    fn times_have_three_decimals() {
        assert_eq!(
            rfc3339(1_764_158_194_510, Precision::Millis),
            "2025-11-26T11:56:34.510Z"
        );
        assert_eq!(
            rfc3339(1_764_158_194_000, Precision::Millis),
            "2025-11-26T11:56:34.000Z"
        );
    }
}
