//! The report stage: outcomes are written to the ledger in batches (one
//! transaction each, counters moved by affected rows), retried until the
//! database takes them, never dropped. When the last outcome of a job is
//! recorded, the job is finished (deleted or released). Each permanent
//! failure is logged with the relay's reply, within a budget (see
//! [`FailureLog`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fate::finish;
use super::pipeline::SendOutcome;
use super::shared::Shared;
use crate::store::deliveries::{self, Outcome, OutcomeKind, Recorded};

/// Most outcomes written in one transaction.
pub const MAX_BATCH: usize = 2_000;
/// Longest an outcome waits for others to be written with it.
const GATHER_WINDOW: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// While failures come in, the campaigns' flags are re-read at most this
/// often (an auto-pause takes effect within it, not within the regular
/// refresh).
const FAILURE_LOOK_INTERVAL: Duration = Duration::from_millis(50);
/// Permanent failures logged one by one before the budget applies...
const FAILURE_LOG_BURST: f64 = 20.0;
/// ...which then allows one line per this long; the rest are counted.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(1);

/// The log of permanent failures: one line per failure with the campaign,
/// the recipient's id (not the address: logs travel further than the
/// database, and the id finds the row) and the relay's reply, with the
/// local part of any address in it masked. A token bucket bounds it, so a
/// relay that refuses everything cannot flood the log; failures held back
/// are counted in the next line that is written, and when the worker stops.
struct FailureLog {
    budget: f64,
    refilled: Instant,
    held_back: u64,
}

impl FailureLog {
    fn new() -> FailureLog {
        FailureLog {
            budget: FAILURE_LOG_BURST,
            refilled: Instant::now(),
            held_back: 0,
        }
    }

    /// Log `kind` for `recipient` if it is a failure for good.
    fn note(
        &mut self,
        campaign: i64,
        recipient: i64,
        attempt: i32,
        kind: &OutcomeKind,
        state: Recorded,
    ) {
        let (reply, what) = match (kind, state) {
            (OutcomeKind::Failed(reply), Recorded::Final) => {
                (reply, "failed for good: permanent failure")
            }
            (OutcomeKind::Bounced(reply), Recorded::Final) => (
                reply,
                "failed for good: permanent failure; the address is bad, the recipient is now bounced",
            ),
            (OutcomeKind::Retry(reply), Recorded::Final) => (
                reply,
                "failed for good: temporary failures up to --max-attempts",
            ),
            _ => return,
        };
        let now = Instant::now();
        let refill =
            now.duration_since(self.refilled).as_secs_f64() / FAILURE_LOG_EVERY.as_secs_f64();
        self.budget = (self.budget + refill).min(FAILURE_LOG_BURST);
        self.refilled = now;
        if self.budget < 1.0 {
            self.held_back += 1;
            return;
        }
        self.budget -= 1.0;
        let reply = mask_addresses(reply);
        match std::mem::take(&mut self.held_back) {
            0 => tracing::warn!(campaign, recipient, attempts = attempt, %reply, "{what}"),
            n => tracing::warn!(
                campaign,
                recipient,
                attempts = attempt,
                %reply,
                not_logged = n,
                "{what} (and {n} more since the last such line)"
            ),
        }
    }
}

impl Drop for FailureLog {
    fn drop(&mut self) {
        if self.held_back > 0 {
            tracing::warn!(
                not_logged = self.held_back,
                "more permanent failures than the log budget; `mailsplit status` counts them all and the ledger has each reply"
            );
        }
    }
}

/// `reply` with the local part of every address in it replaced by `***`
/// (relays often quote the recipient: `550 5.1.1 <ada@example.com>: …`).
/// The domain stays: it is what tells a misconfiguration apart.
fn mask_addresses(reply: &str) -> String {
    let local = |c: char| !(c.is_whitespace() || "<>()[]\",;:'\"".contains(c));
    let mut out = String::with_capacity(reply.len());
    let mut rest = reply;
    while let Some(at) = rest.find('@') {
        let before = &rest[..at];
        let start = match before.strip_suffix('"').and_then(|b| b.rfind('"')) {
            // A quoted local part: `"ada lovelace"@example.com`.
            Some(open) => open,
            None => before
                .char_indices()
                .rev()
                .take_while(|&(_, c)| local(c))
                .last()
                .map_or(at, |(i, _)| i),
        };
        out.push_str(&rest[..start]);
        if start < at {
            out.push_str(crate::redact::HIDDEN);
        }
        out.push('@');
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

/// When the reporter re-reads the campaigns' flags. A batch that
/// auto-paused a campaign (see `store::autopause`) means stop sending for it
/// now. A batch with failures may show that another worker's batch paused
/// one: look at once rather than at the next flag refresh (at most every
/// FAILURE_LOOK_INTERVAL), so a relay refusing everything costs as few
/// recipients as possible.
struct FlagLook {
    last: tokio::time::Instant,
}

impl FlagLook {
    fn new(now: tokio::time::Instant) -> FlagLook {
        FlagLook {
            last: now.checked_sub(FAILURE_LOOK_INTERVAL).unwrap_or(now),
        }
    }

    /// Whether a batch with `outcomes`, that paused campaigns or not, calls
    /// for a look at `now` (noted as the last look if so).
    fn due(&mut self, outcomes: &[Outcome], paused: bool, now: tokio::time::Instant) -> bool {
        let failures = outcomes
            .iter()
            .any(|o| matches!(o.kind, OutcomeKind::Failed(_) | OutcomeKind::Bounced(_)));
        let due = paused || (failures && now.duration_since(self.last) >= FAILURE_LOOK_INTERVAL);
        if due {
            self.last = now;
        }
        due
    }
}

/// Runs until `drained` (every job finished) and nothing is left to write.
/// `gather` is the batch size worth waiting [`GATHER_WINDOW`] for; a sender
/// waits for its outcome's commit before its next message (see
/// [`super::pipeline::SendOutcome::unrecorded`]), so it is a fraction of the senders.
pub async fn reporter(
    shared: Arc<Shared>,
    mut inbox: mpsc::Receiver<SendOutcome>,
    drained: CancellationToken,
    gather: usize,
) {
    let mut batch: Vec<SendOutcome> = Vec::with_capacity(MAX_BATCH);
    let mut look = FlagLook::new(tokio::time::Instant::now());
    let mut failure_log = FailureLog::new();
    loop {
        // Take what is waiting, up to MAX_BATCH: under load batches grow by
        // themselves while the previous one is being written.
        let n = tokio::select! {
            n = inbox.recv_many(&mut batch, MAX_BATCH) => n,
            _ = drained.cancelled(), if inbox.is_empty() => 0,
        };
        if n == 0 {
            break;
        }
        gather_more(&mut inbox, &mut batch, gather).await;
        let outcomes = ledger_outcomes(&batch);
        let deliveries::Recording {
            results: recorded,
            paused,
        } = record(&shared, &outcomes).await;
        let sent = batch
            .iter()
            .zip(&recorded)
            .filter(|(r, s)| r.kind == OutcomeKind::Sent && **s == Recorded::Final)
            .count();
        shared.sent.fetch_add(sent as u64, Ordering::Relaxed);
        if look.due(&outcomes, !paused.is_empty(), tokio::time::Instant::now()) {
            if let Err(e) = shared.campaigns.refresh(&shared.db).await {
                tracing::warn!(error = %e, "cannot refresh campaign flags");
            }
        }
        for (report, state) in batch.drain(..).zip(recorded) {
            failure_log.note(
                report.tracker.campaign_id,
                report.recipient_id,
                report.attempt,
                &report.kind,
                state,
            );
            if report.tracker.complete(&report.kind, state, report.attempt) {
                finish(&shared, &report.tracker).await;
            }
        }
    }
}

/// The ledger's view of a batch: shared with the blocking task that
/// writes it, and with each retry of that write.
fn ledger_outcomes(batch: &[SendOutcome]) -> Arc<Vec<Outcome>> {
    Arc::new(
        batch
            .iter()
            .map(|r| Outcome {
                campaign_id: r.tracker.campaign_id,
                recipient_id: r.recipient_id,
                token: r.tracker.token,
                kind: r.kind.clone(),
                content_version: r.content_version,
            })
            .collect(),
    )
}

/// Group commit: a few statements and one commit cost the same for 2
/// outcomes as for 50, and both workers queue for SQLite's one write lock.
/// Gather up to `gather` outcomes for a while (at most GATHER_WINDOW, so
/// nothing waits long) before writing.
async fn gather_more(
    inbox: &mut mpsc::Receiver<SendOutcome>,
    batch: &mut Vec<SendOutcome>,
    gather: usize,
) {
    let deadline = tokio::time::Instant::now() + GATHER_WINDOW;
    while batch.len() < gather {
        let room = MAX_BATCH - batch.len();
        match tokio::time::timeout_at(deadline, inbox.recv_many(batch, room)).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

/// Write a batch of outcomes to the ledger, retrying with a doubling,
/// capped delay until the database takes them.
async fn record(shared: &Shared, outcomes: &Arc<Vec<Outcome>>) -> deliveries::Recording {
    let mut backoff = Duration::from_millis(200);
    loop {
        let todo = Arc::clone(outcomes);
        let max_attempts = shared.max_attempts;
        match shared
            .db
            .run(move |c| deliveries::record_batch(c, &todo, max_attempts))
            .await
        {
            Ok(r) => return r,
            Err(e) => {
                tracing::error!(error = %e, outcomes = outcomes.len(), retry_in = ?backoff, "cannot record outcomes; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_replies_keep_only_their_domain() {
        assert_eq!(
            mask_addresses("550 5.1.1 <ada.l+x@example.com>: Recipient address rejected"),
            "550 5.1.1 <***@example.com>: Recipient address rejected"
        );
        assert_eq!(
            mask_addresses("550 user \"bob\"@x.test unknown, also eve@y.test"),
            "550 user ***@x.test unknown, also ***@y.test"
        );
        assert_eq!(
            mask_addresses("452 4.2.2 @ mailbox full"),
            "452 4.2.2 @ mailbox full"
        );
    }

    fn outcome(kind: OutcomeKind) -> Outcome {
        Outcome {
            campaign_id: 1,
            recipient_id: 2,
            token: 3,
            kind,
            content_version: None,
        }
    }

    #[test]
    fn flags_are_looked_at_after_a_pause_at_once_and_after_failures_at_most_every_interval() {
        let start = tokio::time::Instant::now();
        let mut look = FlagLook::new(start);
        let sent = [
            outcome(OutcomeKind::Sent),
            outcome(OutcomeKind::Retry("451".into())),
        ];
        let failed = [
            outcome(OutcomeKind::Sent),
            outcome(OutcomeKind::Failed("550".into())),
        ];
        assert!(!look.due(&sent, false, start));
        assert!(
            look.due(&failed, false, start),
            "the first failures look at once"
        );
        let soon = start + FAILURE_LOOK_INTERVAL / 2;
        assert!(!look.due(&failed, false, soon));
        assert!(
            look.due(&sent, true, soon),
            "a pause looks whatever the interval"
        );
        assert!(!look.due(&failed, false, soon + FAILURE_LOOK_INTERVAL / 2));
        assert!(look.due(&failed, false, soon + FAILURE_LOOK_INTERVAL));
        let bounced = [outcome(OutcomeKind::Bounced("550 5.1.1".into()))];
        assert!(look.due(&bounced, false, soon + FAILURE_LOOK_INTERVAL * 3));
    }
}
