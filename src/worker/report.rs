//! The report stage: outcomes are written to the ledger in batches (one
//! transaction each, counters moved by affected rows), retried until the
//! database takes them, never dropped. When the last outcome of a job is
//! recorded, the job is finished (deleted or released).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fate::finish;
use super::pipeline::{Report, Shared};
use crate::store::deliveries::{self, Outcome, OutcomeKind};

/// Most outcomes written in one transaction.
pub const MAX_BATCH: usize = 2_000;
/// Longest an outcome waits for others to be written with it.
const GATHER_WINDOW: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// While failures come in, the campaigns' flags are re-read at most this
/// often (an auto-pause takes effect within it, not within the regular
/// refresh).
const FAILURE_LOOK_INTERVAL: Duration = Duration::from_millis(50);

/// Runs until `drained` (every job finished) and nothing is left to write.
/// `gather` is the batch size worth waiting [`GATHER_WINDOW`] for; a sender
/// waits for its outcome's commit before its next message (see
/// [`super::pipeline::Report::unrecorded`]), so it is a fraction of the senders.
pub async fn reporter(
    shared: Arc<Shared>,
    mut inbox: mpsc::Receiver<Report>,
    drained: CancellationToken,
    gather: usize,
) {
    let mut batch: Vec<Report> = Vec::with_capacity(MAX_BATCH);
    let now = tokio::time::Instant::now();
    let mut last_look = now.checked_sub(FAILURE_LOOK_INTERVAL).unwrap_or(now);
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
        // Group commit: a few statements and one commit cost the same for
        // 2 outcomes as for 50, and both workers queue for SQLite's one
        // write lock. Gather a while (at most GATHER_WINDOW, so nothing waits
        // long) before writing.
        let deadline = tokio::time::Instant::now() + GATHER_WINDOW;
        while batch.len() < gather {
            let room = MAX_BATCH - batch.len();
            match tokio::time::timeout_at(deadline, inbox.recv_many(&mut batch, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let outcomes: Arc<Vec<Outcome>> = Arc::new(
            batch
                .iter()
                .map(|r| Outcome {
                    campaign_id: r.tracker.campaign_id,
                    recipient_id: r.recipient_id,
                    token: r.tracker.token,
                    kind: r.kind.clone(),
                })
                .collect(),
        );
        let mut backoff = Duration::from_millis(200);
        let recorded = loop {
            let todo = Arc::clone(&outcomes);
            let max_attempts = shared.max_attempts;
            match shared
                .db
                .run(move |c| deliveries::record(c, &todo, max_attempts))
                .await
            {
                Ok(r) => break r,
                Err(e) => {
                    tracing::error!(error = %e, outcomes = outcomes.len(), retry_in = ?backoff, "cannot record outcomes; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        // A batch with failures may have auto-paused its campaign (see
        // `store::autopause`): look at once rather than at the next flag
        // refresh, so a relay refusing everything costs as few recipients
        // as possible.
        let failures = outcomes
            .iter()
            .any(|o| matches!(o.kind, OutcomeKind::Failed(_) | OutcomeKind::Bounced(_)));
        if failures && last_look.elapsed() >= FAILURE_LOOK_INTERVAL {
            last_look = tokio::time::Instant::now();
            if let Err(e) = shared.campaigns.refresh(&shared.db).await {
                tracing::warn!(error = %e, "cannot refresh campaign flags");
            }
        }
        for (report, state) in batch.drain(..).zip(recorded) {
            if report.tracker.complete(&report.kind, state, report.attempt) {
                finish(&shared, &report.tracker).await;
            }
        }
    }
}
