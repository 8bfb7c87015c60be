//! The send stage: `concurrency` tasks, each owning one long-lived SMTP
//! session, taking composed messages from a bounded channel. Before each
//! message a sender checks the campaign's cached pause/cancel flag, the
//! abort signal and whether the recipient just left; then it sends and
//! turns the reply into an outcome.

use std::sync::Arc;
use std::time::Duration;

use lettre::transport::smtp::client::AsyncSmtpConnection;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::pipeline::{Msg, Report, Shared};
use crate::mail::{Relay, Verdict};
use crate::store::OutcomeKind;

const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Longest a sender waits for rate tokens before handing the message back
/// (its job is then released until tokens are due), so a throttled domain
/// does not hold every sender while other mail could flow.
const MAX_TOKEN_WAIT: Duration = Duration::from_secs(5);

pub async fn sender(
    shared: Arc<Shared>,
    inbox: async_channel::Receiver<Msg>,
    outbox: mpsc::Sender<Report>,
    relay: Relay,
    abort: CancellationToken,
) {
    let mut session: Option<AsyncSmtpConnection> = None;
    let mut backoff = Duration::from_millis(500);
    while let Ok(msg) = inbox.recv().await {
        // Wait while `concurrency` messages are already out but unrecorded.
        let Ok(permit) = Arc::clone(&shared.unrecorded).acquire_owned().await else {
            break;
        };
        let kind = loop {
            if abort.is_cancelled() || shared.campaigns.blocked(msg.tracker.campaign_id).await {
                break OutcomeKind::Unclaim;
            }
            if let Err(t) = shared
                .limiter
                .acquire(&msg.rate_groups, msg.weight, MAX_TOKEN_WAIT)
                .await
            {
                msg.tracker.throttle(t.retry_in);
                break OutcomeKind::Unclaim;
            }
            // After the wait for tokens, which can last seconds.
            if let Some(status) = shared.optouts.left(msg.recipient_id) {
                break OutcomeKind::Skipped(status.as_str().to_string());
            }
            let conn = match session.as_mut() {
                Some(c) if !c.has_broken() => c,
                _ => match relay.connect().await {
                    Ok(c) => {
                        backoff = Duration::from_millis(500);
                        session.insert(c)
                    }
                    Err(e) => {
                        // The relay is down: this message has not been tried,
                        // so it keeps its attempt; wait and reconnect.
                        session = None;
                        tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), retry_in = ?backoff, "SMTP connect failed");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = abort.cancelled() => {}
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                },
            };
            break match relay.send(conn, &msg.composed).await {
                Verdict::Sent => {
                    shared.limiter.success(&msg.rate_groups).await;
                    OutcomeKind::Sent
                }
                Verdict::Permanent(reply) if reply.says_bad_address() => {
                    OutcomeKind::Bounced(reply.text)
                }
                Verdict::Permanent(reply) => OutcomeKind::Failed(reply.text),
                Verdict::Transient(reply) => {
                    if reply.asks_to_slow_down() {
                        tracing::warn!(%reply, "relay asks to slow down");
                        shared.limiter.slow_down(&msg.rate_groups).await;
                    }
                    OutcomeKind::Retry(reply.text)
                }
            };
        };
        let report = Report {
            tracker: msg.tracker,
            recipient_id: msg.recipient_id,
            attempt: msg.attempt,
            kind,
            unrecorded: Some(permit),
        };
        if outbox.send(report).await.is_err() {
            break;
        }
    }
    if let Some(mut c) = session {
        let _ = tokio::time::timeout(Duration::from_secs(2), c.quit()).await;
    }
}
