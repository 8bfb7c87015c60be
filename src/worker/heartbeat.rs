//! The worker's row in the fleet table (`store::workers`): who it is (host,
//! pid, which binary), written when it starts, refreshed every
//! [`HEARTBEAT`] with its sent count and rate, marked `stopping` the moment
//! it is told to stop, and deleted after a clean exit. A worker killed with
//! `-9` leaves its row behind, which readers then show as lost.
//!
//! The binary is identified by the SHA-256 of the file the process really
//! runs (`/proc/self/exe`, which still opens the old file after a deploy
//! renamed a new one over it), so `mailsplit workers` can tell old-binary
//! workers from new ones on every machine.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use crate::config::{FORGET_LOST, HEARTBEAT};
use crate::store::now_ms;
use crate::store::rates;
use crate::store::workers::{self, WorkerRow, WorkerState};

/// Hex characters of the binary's SHA-256 kept in the row.
const HASH_CHARS: usize = 32;

/// The running heartbeat; [`Heartbeat::finish`] removes the row.
pub struct Heartbeat {
    shared: Arc<Shared>,
    done: CancellationToken,
    task: JoinHandle<Option<String>>,
}

impl Heartbeat {
    /// Start beating. `stop` is the worker's stop signal: the row says
    /// `stopping` from then on.
    pub fn start(
        shared: Arc<Shared>,
        relay: &str,
        concurrency: usize,
        stop: CancellationToken,
    ) -> Heartbeat {
        let done = CancellationToken::new();
        let started_at = now_ms();
        let host = crate::config::host_name();
        let pid = i64::from(std::process::id());
        let row = WorkerRow {
            id: format!("{host}/{pid}/{started_at}"),
            host,
            pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            binary_hash: String::new(),
            binary_size: 0,
            binary_mtime: 0,
            relay: relay.to_string(),
            concurrency: concurrency as i64,
            state: WorkerState::Running,
            started_at,
            seen_at: started_at,
            sent: 0,
            rate: 0.0,
            tube: shared.tube.clone(),
            foreign_jobs: 0,
            foreign_databases: String::new(),
        };
        let task = tokio::spawn(beat(Arc::clone(&shared), row, stop, done.clone()));
        Heartbeat { shared, done, task }
    }

    /// Stop beating and delete the row: the worker leaves the fleet. Called
    /// after the reporter flushed, so the last beat had the final count.
    pub async fn finish(self) {
        self.done.cancel();
        let Ok(Some(id)) = self.task.await else {
            return;
        };
        let removed = {
            let id = id.clone();
            self.shared.db.run(move |c| {
                rates::forget_usage(c, &id)?;
                workers::remove(c, &id)
            })
        };
        match tokio::time::timeout(Duration::from_secs(5), removed).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, worker = %id, "cannot remove this worker's heartbeat row; it will show as lost")
            }
            Err(_) => {
                tracing::warn!(worker = %id, "database too slow to remove this worker's heartbeat row; it will show as lost")
            }
        }
    }
}

/// The other databases whose jobs this worker met, sorted, comma-separated.
fn foreign_databases(shared: &Shared) -> String {
    let set = shared.foreign.lock().unwrap_or_else(|p| p.into_inner());
    let mut ids: Vec<&str> = set.iter().map(String::as_str).collect();
    ids.sort_unstable();
    ids.join(",")
}

/// The heartbeat task; returns the row's id once it has been written.
async fn beat(
    shared: Arc<Shared>,
    mut row: WorkerRow,
    stop: CancellationToken,
    done: CancellationToken,
) -> Option<String> {
    // Hashing a large binary takes a moment: off the async threads, and
    // before the first beat, so every row names its binary.
    let identity = tokio::task::spawn_blocking(binary_identity);
    let identity = tokio::select! {
        found = identity => found.ok().flatten(),
        _ = done.cancelled() => return None,
    };
    let (hash, size, mtime) = identity.unwrap_or_else(|| ("unknown".into(), 0, 0));
    row.binary_hash = hash;
    row.binary_size = size;
    row.binary_mtime = mtime;
    forget_lost(&shared).await;
    let mut last = (Instant::now(), 0i64);
    let mut last_spent: (Instant, HashMap<String, u64>) = (Instant::now(), HashMap::new());
    let mut failing = false;
    loop {
        let sent = shared.sent.load(Ordering::Relaxed) as i64;
        let elapsed = last.0.elapsed().as_secs_f64();
        if elapsed > 0.5 {
            row.rate = ((sent - last.1) as f64 / elapsed * 10.0).round() / 10.0;
            last = (Instant::now(), sent);
        }
        row.sent = sent;
        row.seen_at = now_ms();
        row.foreign_jobs = shared.foreign_jobs.load(Ordering::Relaxed) as i64;
        row.foreign_databases = foreign_databases(&shared);
        row.state = if stop.is_cancelled() {
            WorkerState::Stopping
        } else {
            WorkerState::Running
        };
        let usage = rate_usage(&shared, &mut last_spent);
        failing = write(&shared, &row, usage, failing).await;
        let stopping = row.state == WorkerState::Stopping;
        tokio::select! {
            _ = done.cancelled() => return Some(row.id),
            // Say "stopping" at once, not at the next beat.
            _ = stop.cancelled(), if !stopping => {}
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
    }
}

/// Write one beat and this worker's rate usage; whether it failed (a
/// failure is logged once per outage: the worker keeps sending
/// regardless).
async fn write(shared: &Shared, row: &WorkerRow, usage: Vec<rates::Usage>, failing: bool) -> bool {
    let written = {
        let row = row.clone();
        shared
            .db
            .run(move |c| {
                workers::beat(c, &row)?;
                rates::report_usage(c, &row.id, &usage)
            })
            .await
    };
    match written {
        Ok(()) if failing => {
            tracing::info!("heartbeat written again");
            false
        }
        Ok(()) => false,
        Err(e) if !failing => {
            tracing::warn!(error = %e, "cannot write this worker's heartbeat; it may show as lost");
            true
        }
        Err(_) => true,
    }
}

/// Drop the rows of workers lost for longer than `FORGET_LOST`.
async fn forget_lost(shared: &Shared) {
    let cutoff = now_ms() - FORGET_LOST.as_millis() as i64;
    match shared
        .db
        .run(move |c| {
            rates::forget_usage_before(c, cutoff)?;
            workers::forget_silent_since(c, cutoff)
        })
        .await
    {
        Ok(0) => {}
        Ok(n) => tracing::info!(rows = n, "forgot workers lost for over a day"),
        Err(e) => tracing::warn!(error = %e, "cannot prune lost workers' rows"),
    }
}

/// This worker's use of each rate group since the last beat: tokens spent
/// (and per second), recipients parked and deferred.
fn rate_usage(shared: &Shared, last: &mut (Instant, HashMap<String, u64>)) -> Vec<rates::Usage> {
    let spent = shared.limiter.spent();
    let parked = shared.scheduler.usage();
    let elapsed = last.0.elapsed().as_secs_f64();
    let mut names: Vec<&String> = spent.keys().chain(parked.keys()).collect();
    names.sort();
    names.dedup();
    // Groups this worker never used are left out (there may be many).
    let rows = names
        .into_iter()
        .filter(|name| spent.get(*name).is_some_and(|&n| n > 0) || parked.contains_key(*name))
        .map(|name| {
            let total = spent.get(name).copied().unwrap_or(0);
            let before = last.1.get(name).copied().unwrap_or(0);
            let p = parked.get(name).copied().unwrap_or_default();
            rates::Usage {
                name: name.clone(),
                spent: total as i64,
                spent_rate: if elapsed > 0.1 {
                    ((total.saturating_sub(before)) as f64 / elapsed * 10.0).round() / 10.0
                } else {
                    0.0
                },
                parked: p.parked as i64,
                deferred: p.deferred as i64,
            }
        })
        .collect();
    *last = (Instant::now(), spent);
    rows
}

/// SHA-256 (hex prefix), size and modification time (ms) of the
/// executable this process runs.
fn binary_identity() -> Option<(String, i64, i64)> {
    let running = Path::new("/proc/self/exe");
    let path = if running.exists() {
        running.to_path_buf()
    } else {
        std::env::current_exe().ok()?
    };
    let mut file = std::fs::File::open(&path).ok()?;
    let meta = file.metadata().ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mtime = meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000;
    Some((hex[..HASH_CHARS].to_string(), meta.len() as i64, mtime))
}
