//! Where an import's parsed rows go: batched, written under the store's
//! rules, counted; one import of a list at a time (the list's import
//! lock, held from before the first row until the end).

use std::collections::HashMap;

use super::writers::Writers;
use super::{ImportError, Options, Rejected, Summary};
use crate::store::import_lock::{self, ImportLock};
use crate::store::imports::{self, Row, Run, Written};
use crate::store::{Backend, Conn, StoreError};

/// Where parsed rows go: batched, written, counted.
pub(super) struct Sink<'a> {
    conn: &'a mut Conn,
    /// What the source's rows are called in reports: `line` (a file) or
    /// `row` (a query).
    unit: &'static str,
    /// The list's import lock, taken by [`Sink::lock`].
    lock: Option<ImportLock>,
    /// Begun when the source has proved readable (its header).
    run: Option<Run>,
    list: &'a str,
    options: Options,
    pub(super) batch: Batch,
    pub(super) summary: Summary,
    on_reject: &'a mut dyn FnMut(&Rejected),
    /// PostgreSQL: the connections the batches are written on, each
    /// committing without waiting for the disk (see
    /// [`imports::begin_batch`]).
    writers: Option<Writers>,
}

impl<'a> Sink<'a> {
    pub(super) fn new(
        conn: &'a mut Conn,
        list: &'a str,
        options: Options,
        unit: &'static str,
        on_reject: &'a mut dyn FnMut(&Rejected),
    ) -> Sink<'a> {
        Sink {
            conn,
            unit,
            lock: None,
            run: None,
            list,
            options,
            batch: Batch::default(),
            summary: Summary::default(),
            on_reject,
            writers: None,
        }
    }

    /// Wait for the list's import lock (`on_wait` hears if it is held).
    pub(super) fn lock(&mut self, on_wait: &mut dyn FnMut()) -> Result<(), StoreError> {
        if self.lock.is_none() {
            self.lock = Some(import_lock::acquire(self.conn, self.list, on_wait)?);
        }
        Ok(())
    }

    pub(super) fn row(&mut self, line: u64, row: Result<Row, String>) -> Result<(), StoreError> {
        self.summary.read += 1;
        match row {
            Ok(mut row) => {
                row.line = line;
                let email = row.email.clone();
                if let Some(first) = self.batch.push(row) {
                    self.duplicate(line, Some((first, &email)));
                }
            }
            Err(reason) => {
                self.summary.skipped += 1;
                (self.on_reject)(&Rejected { line, reason });
            }
        }
        Ok(())
    }

    /// A row naming a mailbox an earlier one named; `first` is that row
    /// and this row's address, when this batch holds it.
    fn duplicate(&mut self, line: u64, first: Option<(u64, &str)>) {
        self.summary.duplicates += 1;
        let unit = self.unit;
        let reason = match first {
            Some((first, email)) => {
                format!("duplicate: {email} is the same mailbox as {unit} {first}, which is kept")
            }
            None => format!("duplicate: the same mailbox as an earlier {unit}, which is kept"),
        };
        (self.on_reject)(&Rejected { line, reason });
    }

    fn run(&mut self) -> Result<Run, StoreError> {
        match self.run {
            Some(run) => Ok(run),
            None => {
                let run = imports::begin(self.conn, self.list)?;
                self.run = Some(run);
                Ok(run)
            }
        }
    }

    pub(super) fn flush(&mut self) -> Result<(), StoreError> {
        let run = self.run()?;
        self.batch.by_key.clear();
        let rows = std::mem::take(&mut self.batch.rows);
        if rows.is_empty() {
            return Ok(());
        }
        let resubscribe = self.options.resubscribe;
        let written = match self.conn.backend() {
            Backend::Postgres => {
                let writers = match &mut self.writers {
                    Some(writers) => writers,
                    none => none.insert(Writers::start(self.conn, run, resubscribe)?),
                };
                let mut rows = rows;
                let ids = imports::draw_ids(self.conn, rows.len())?;
                for (row, id) in rows.iter_mut().zip(ids) {
                    row.new_id = Some(id);
                }
                writers.write(rows)?
            }
            // One statement per 1,000 rows: well under SQLite's
            // bound-parameter limit.
            Backend::Sqlite => self.conn.transaction(|conn| {
                rows.chunks(1_000)
                    .map(|chunk| imports::write_batch(conn, run, chunk, resubscribe))
                    .collect::<Result<Vec<_>, _>>()
            })?,
        };
        self.count(written);
        Ok(())
    }

    /// Add what written batches did to the summary, and report their
    /// duplicates in source order.
    fn count(&mut self, written: Vec<Written>) {
        let mut duplicates = Vec::new();
        for w in written {
            self.summary.added += w.added;
            self.summary.updated += w.updated;
            self.summary.unchanged += w.unchanged;
            self.summary.kept_unsubscribed += w.kept_unsubscribed;
            self.summary.forgotten += w.forgotten;
            self.summary.skipped += w.forgotten;
            duplicates.extend(w.duplicates);
        }
        duplicates.sort_unstable();
        for line in duplicates {
            self.duplicate(line, None);
        }
    }

    /// The last batch, `--sync`'s removal, every commit on disk, fresh
    /// planner statistics.
    pub(super) fn finish(mut self) -> Result<Summary, ImportError> {
        self.flush()?;
        // Batches written by the writers were committed without waiting
        // for the disk: made durable below, once the writers are closed.
        let deferred = match self.writers.take() {
            Some(mut writers) => {
                let written = writers.wait()?;
                self.count(written);
                true
            }
            None => false,
        };
        if self.options.sync {
            let run = self.run()?;
            self.refuse_emptying(run)?;
            self.summary.removed = imports::sweep(self.conn, run)?;
        }
        if deferred {
            imports::make_durable(self.conn)?;
        }
        // The tables may have grown by orders of magnitude: let the planner
        // know before enqueue pages through them.
        self.conn
            .refresh_statistics(&["recipients", "list_members"])?;
        if let Some(lock) = self.lock.take() {
            import_lock::release(self.conn, lock)?;
        }
        Ok(std::mem::take(&mut self.summary))
    }

    /// `--sync` from a source that named nobody would empty the list: a
    /// broken export, most likely; only `--allow-empty` does it.
    fn refuse_emptying(&mut self, run: Run) -> Result<(), ImportError> {
        let s = &self.summary;
        if self.options.allow_empty || s.added + s.updated + s.unchanged > 0 {
            return Ok(());
        }
        let members = imports::member_count(self.conn, run)?;
        if members == 0 {
            return Ok(());
        }
        Err(ImportError::EmptySync {
            list: self.list.to_string(),
            members,
            read: s.read,
        })
    }
}

impl Drop for Sink<'_> {
    /// An import that failed gives its lock back too (the process may go
    /// on, and so may its connection).
    fn drop(&mut self) {
        // Writers first: none may still be writing once the lock is free.
        self.writers.take();
        if let Some(lock) = self.lock.take() {
            // Failing here leaves the lock to the connection's end.
            let _ = import_lock::release(self.conn, lock);
        }
    }
}

/// Rows in source order (new recipients get ids in that order), each
/// mailbox once: a later row for a mailbox already in the batch is a
/// duplicate, and the first row wins.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) rows: Vec<Row>,
    by_key: HashMap<String, u64>,
}

impl Batch {
    /// Add `row`, or return the line of the earlier row it duplicates.
    fn push(&mut self, row: Row) -> Option<u64> {
        if let Some(&first) = self.by_key.get(&row.email_key) {
            return Some(first);
        }
        self.by_key.insert(row.email_key.clone(), row.line);
        self.rows.push(row);
        None
    }
}
