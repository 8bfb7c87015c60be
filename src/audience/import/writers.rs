//! PostgreSQL: an import's batches written on two connections at once.
//!
//! The server's work per row (four indexes on `recipients`, a membership's
//! primary key and two foreign-key checks) is what a PostgreSQL import
//! waits for, on one backend and so one core. Each batch is split by
//! mailbox into [`WRITERS`] parts, each written in its own transaction on
//! its own connection and thread, while the next batch is parsed. A
//! mailbox always goes to the same writer and each writer takes its parts
//! in source order, so "the first row wins" holds across batches as it
//! does on one connection, and no two writers ever touch the same
//! recipient or membership (they cannot deadlock on each other's rows).
//! New recipients' ids are drawn in source order before the split
//! ([`imports::draw_ids`]), so they are numbered as on one connection.

use std::hash::{Hash, Hasher};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::store::imports::{self, Row, Run, Written};
use crate::store::{Conn, StoreError};

/// Connections writing at once: two keep PostgreSQL busy while this
/// process parses the next batch, and more only contend for the same
/// cores (BENCHMARKS.md, "Import into PostgreSQL on two connections").
pub(super) const WRITERS: usize = 2;

struct Writer {
    rows: Option<SyncSender<Vec<Row>>>,
    done: Receiver<Result<Written, StoreError>>,
    thread: Option<JoinHandle<()>>,
}

/// The writers, and whether a batch is out with them.
pub(super) struct Writers {
    writers: Vec<Writer>,
    out: bool,
}

impl Writers {
    /// Open the writers' connections (beside `conn`, which keeps the
    /// import's lock) for `run`.
    pub(super) fn start(conn: &Conn, run: Run, resubscribe: bool) -> Result<Writers, StoreError> {
        let mut writers = Vec::with_capacity(WRITERS);
        for _ in 0..WRITERS {
            let mut own = conn.another()?;
            // One batch queued behind the one being written, at most.
            let (rows, queued) = sync_channel::<Vec<Row>>(1);
            let (report, done) = sync_channel(1);
            let thread = std::thread::spawn(move || {
                for part in queued {
                    let written = own.transaction(|c| {
                        imports::begin_batch(c)?;
                        imports::write_batch(c, run, &part, resubscribe)
                    });
                    if report.send(written).is_err() {
                        return;
                    }
                }
            });
            writers.push(Writer {
                rows: Some(rows),
                done,
                thread: Some(thread),
            });
        }
        Ok(Writers {
            writers,
            out: false,
        })
    }

    /// Hand `rows` (no mailbox twice) to the writers, split by mailbox,
    /// once the batch before it is written; returns what that one did.
    pub(super) fn write(&mut self, rows: Vec<Row>) -> Result<Vec<Written>, StoreError> {
        let before = self.wait()?;
        let mut parts: Vec<Vec<Row>> = (0..WRITERS)
            .map(|_| Vec::with_capacity(rows.len() / WRITERS + 1))
            .collect();
        for row in rows {
            parts[writer_of(&row.email_key)].push(row);
        }
        for (w, part) in self.writers.iter().zip(parts) {
            let sent = w.rows.as_ref().is_some_and(|tx| tx.send(part).is_ok());
            if !sent {
                return Err(stopped());
            }
        }
        self.out = true;
        Ok(before)
    }

    /// What the batch out with the writers did, once they are done with
    /// it (nothing if none is out).
    pub(super) fn wait(&mut self) -> Result<Vec<Written>, StoreError> {
        if !std::mem::take(&mut self.out) {
            return Ok(Vec::new());
        }
        let mut written = Vec::with_capacity(WRITERS);
        let mut failed = None;
        // Every writer's answer is taken, so none is left holding a batch.
        for w in &self.writers {
            match w.done.recv() {
                Ok(Ok(part)) => written.push(part),
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some(stopped())),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}

impl Drop for Writers {
    /// Close the queues and wait for the threads: a writer mid-batch
    /// commits it or fails; none outlives the import.
    fn drop(&mut self) {
        for w in &mut self.writers {
            w.rows.take();
        }
        for w in &mut self.writers {
            if let Some(thread) = w.thread.take() {
                // A panicked writer has already failed its batch.
                let _ = thread.join();
            }
        }
    }
}

/// Which writer takes mailbox `key`: the same one for the whole import.
fn writer_of(key: &str) -> usize {
    // SipHash with fixed keys: the same split on every run.
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % WRITERS as u64) as usize
}

/// A writer's thread ended without answering: it panicked.
fn stopped() -> StoreError {
    StoreError::Task("an import writer stopped (it panicked)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_always_goes_to_the_same_writer_and_both_get_work() {
        let keys: Vec<String> = (0..1_000)
            .map(|i| format!("user{i}@example.test"))
            .collect();
        let first: Vec<usize> = keys.iter().map(|k| writer_of(k)).collect();
        let again: Vec<usize> = keys.iter().map(|k| writer_of(k)).collect();
        assert_eq!(first, again);
        let to_first = first.iter().filter(|&&w| w == 0).count();
        // An even split within a few percent, not everything on one.
        assert!((400..=600).contains(&to_first), "{to_first} of 1000");
    }
}
