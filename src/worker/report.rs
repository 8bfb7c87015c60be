//! The report stage: outcomes are written to the ledger in batches (one
//! transaction each, counters moved by affected rows), retried until the
//! database takes them, never dropped. When the last outcome of a job is
//! recorded, the job is finished (deleted or released).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::job::{finish, Report, Shared};
use crate::store::deliveries::{self, Outcome};

/// Most outcomes written in one transaction.
pub const MAX_BATCH: usize = 2_000;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs until `drained` (every job finished) and nothing is left to write.
pub async fn reporter(
    shared: Arc<Shared>,
    mut inbox: mpsc::Receiver<Report>,
    drained: CancellationToken,
) {
    let mut batch: Vec<Report> = Vec::with_capacity(MAX_BATCH);
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
        for (report, state) in batch.drain(..).zip(recorded) {
            if report.tracker.complete(&report.kind, state, report.attempt) {
                finish(&shared, &report.tracker).await;
            }
        }
    }
}
