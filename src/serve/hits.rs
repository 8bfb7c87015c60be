//! `serve`'s batched ledger writes for opens and clicks. A hit
//! goes into a bounded channel and the pixel or redirect is answered at
//! once; one writer thread, on a database connection of its own, records
//! up to [`BATCH`] hits or what came within [`FLUSH_AFTER`] in one
//! transaction (`store::engagement::record_batch`), so an open storm
//! costs the database a few transactions a second, not one per request,
//! and never takes the connection one-click unsubscribes use.
//!
//! Nothing is dropped silently. A failed write is retried (the batch kept,
//! with a doubling delay up to 5 s) until it succeeds or `serve` stops;
//! when the channel is full (the database is slower than the hits), a
//! request waits for room without holding a thread, up to [`WAIT_FOR_ROOM`]
//! (an open) or [`WAIT_FOR_ROOM_CLICK`] (a click); then an open is answered
//! 503 (not recorded, and the client is told so), a click still redirects
//! the reader and is counted in `unrecorded` (`/metrics`:
//! `mailsplit_tracking_unrecorded_total`) and logged. On SIGTERM the
//! writer records what is queued before `serve` exits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::store::engagement::{self, Hit};
use crate::store::Db;

/// Hits waiting for the writer at most.
pub const CAPACITY: usize = 20_000;
/// Hits recorded in one transaction at most.
pub const BATCH: usize = 1_000;
/// How long a hit waits for others to share its transaction.
pub const FLUSH_AFTER: Duration = Duration::from_millis(20);
/// How long an open waits for room in a full channel before its 503.
pub const WAIT_FOR_ROOM: Duration = Duration::from_millis(100);
/// How long a click waits for room before it redirects unrecorded.
pub const WAIT_FOR_ROOM_CLICK: Duration = Duration::from_millis(1_000);
/// Longest pause between retries of a failed write.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// The sending side, shared by the handlers.
pub struct Recorder {
    tx: SyncSender<Hit>,
    stop: Arc<AtomicBool>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Hits recorded, and hits a full channel kept out.
    pub recorded: Arc<AtomicU64>,
    pub unrecorded: AtomicU64,
}

impl Recorder {
    /// Start the writer thread on `db` (a connection of its own).
    pub fn start(db: Arc<Db>) -> std::io::Result<Recorder> {
        let (tx, rx) = sync_channel(CAPACITY);
        let stop = Arc::new(AtomicBool::new(false));
        let recorded = Arc::new(AtomicU64::new(0));
        let writer = {
            let (stop, recorded) = (Arc::clone(&stop), Arc::clone(&recorded));
            std::thread::Builder::new()
                .name("hit-writer".into())
                .spawn(move || write_loop(&db, &rx, &stop, &recorded))?
        };
        Ok(Recorder {
            tx,
            stop,
            writer: Mutex::new(Some(writer)),
            recorded,
            unrecorded: AtomicU64::new(0),
        })
    }

    /// Queue `hit`, waiting up to `patience` for room; `false`: the
    /// channel stayed full (or the writer is gone).
    pub async fn queue(&self, hit: Hit, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let mut hit = hit;
        loop {
            match self.tx.try_send(hit) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    if Instant::now() >= deadline {
                        self.unrecorded.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                    hit = back;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
    }

    /// Record what is queued and stop the writer (after the listeners
    /// stopped).
    pub fn finish(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = writer {
            if w.join().is_err() {
                tracing::error!("the hit writer panicked");
            }
        }
    }
}

/// Gather a batch, record it (retrying until it is written or `serve`
/// stops), repeat; on stop, drain the channel first.
fn write_loop(db: &Db, rx: &Receiver<Hit>, stop: &AtomicBool, recorded: &AtomicU64) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(hit) => batch.push(hit),
            Err(RecvTimeoutError::Timeout) if !stopping => continue,
            Err(_) => return,
        }
        let until = Instant::now() + FLUSH_AFTER;
        while batch.len() < BATCH {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(hit) => batch.push(hit),
                Err(_) => break,
            }
        }
        if write(db, &batch, stop) {
            recorded.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        batch.clear();
    }
}

/// Record one batch, retrying with a doubling delay; after the stop
/// signal, a few more tries only (the process is going away).
fn write(db: &Db, batch: &[Hit], stop: &AtomicBool) -> bool {
    let mut delay = Duration::from_millis(50);
    let mut tries_after_stop = 3;
    loop {
        match db.run_blocking(|c| engagement::record_batch(c, batch)) {
            Ok(()) => return true,
            Err(e) => {
                tracing::warn!(hits = batch.len(), error = %e, "cannot record opens and clicks yet; retrying");
                if stop.load(Ordering::SeqCst) {
                    tries_after_stop -= 1;
                    if tries_after_stop == 0 {
                        tracing::error!(
                            hits = batch.len(),
                            "serve is stopping: these opens and clicks are not recorded"
                        );
                        return false;
                    }
                }
                std::thread::sleep(delay);
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
        }
    }
}
