//! A database handle for async code (the worker, `serve`): one connection
//! used from blocking tasks, re-opened after it fails with a
//! connection-type error, so a database restart costs a few retries instead
//! of the process.
//!
//! A bounded handle ([`Db::bounded`], the worker's) also gives up on a call
//! to PostgreSQL that has not answered within its limit. A link that went
//! silent can leave libpq waiting forever for an answer: a query whose
//! bytes a dead switch or proxy swallowed (and acknowledged) is never sent
//! again, and nothing ever arrives to reset the connection. Since calls take
//! turns on the one connection, that one call would hold every later call
//! of the process (heartbeat, claim extensions, outcomes) without an error
//! to log. So the call that outlives its limit fails with
//! [`StoreError::Stalled`], its connection is left to the blocked thread,
//! and the next call opens a new one. The session of a bounded handle also
//! has the server end any transaction left idle for half that long: the
//! server never hears from the client of a swallowed statement either, and
//! the row locks of its open transaction would keep every other worker
//! from those rows; half, so that another process's call waiting on those
//! locks gets them before its own limit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{backend_of, Backend, Conn, Result, StoreError};

pub struct Db {
    url: String,
    /// The connection calls take turns on. Replaced by a fresh, empty one
    /// when a call on it outlived the limit.
    slot: Mutex<Arc<Slot>>,
    plans: Plans,
    /// How long an async call on PostgreSQL may take (see the module's
    /// documentation); `None`: as long as it takes.
    limit: Option<Duration>,
}

/// One connection and whether it was given up.
#[derive(Default)]
struct Slot {
    conn: Mutex<Option<Conn>>,
    /// A call on it outlived the limit: calls still queued for it fail at
    /// once rather than run late on a connection nobody waits for.
    abandoned: AtomicBool,
}

/// How the connection's prepared statements are planned on PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plans {
    /// For each execution's values (every connection's default).
    Custom,
    /// Once per connection while the ledger is large (a worker's few hot
    /// statements; see `store::plans`).
    GenericWhileLarge,
}

impl Db {
    pub fn new(url: &str, conn: Option<Conn>, plans: Plans) -> Arc<Db> {
        Db::with_limit(url, conn, plans, None)
    }

    /// A handle whose async calls to PostgreSQL fail with
    /// [`StoreError::Stalled`] after `limit`, and whose sessions end a
    /// transaction left idle for half of it (see the module's
    /// documentation).
    /// Nothing changes on SQLite, which has no link to lose (its busy
    /// timeout bounds a wait for the write lock).
    pub fn bounded(
        url: &str,
        conn: Option<Conn>,
        plans: Plans,
        limit: Duration,
    ) -> Result<Arc<Db>> {
        let limit = (backend_of(url)? == Backend::Postgres).then_some(limit);
        let conn = match (conn, limit) {
            (Some(mut c), Some(limit)) => {
                c.end_idle_transactions_after(limit / 2)?;
                Some(c)
            }
            (conn, _) => conn,
        };
        Ok(Db::with_limit(url, conn, plans, limit))
    }

    fn with_limit(url: &str, conn: Option<Conn>, plans: Plans, limit: Option<Duration>) -> Arc<Db> {
        Arc::new(Db {
            url: url.to_string(),
            slot: Mutex::new(Arc::new(Slot {
                conn: Mutex::new(conn),
                abandoned: AtomicBool::new(false),
            })),
            plans,
            limit,
        })
    }

    /// Run `f` on the connection in a blocking task; on a bounded handle,
    /// give up after its limit.
    pub async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn) -> Result<T> + Send + 'static,
    {
        let db = Arc::clone(self);
        let slot = self.current();
        let on = Arc::clone(&slot);
        let task = tokio::task::spawn_blocking(move || db.run_on(&on, f));
        let joined = match self.limit {
            None => task.await,
            Some(limit) => match tokio::time::timeout(limit, task).await {
                Ok(joined) => joined,
                Err(_) => {
                    self.abandon(&slot);
                    return Err(StoreError::Stalled(limit));
                }
            },
        };
        joined.unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))
    }

    /// Run `f` on the connection on this thread (a thread of its own),
    /// for as long as it takes.
    pub fn run_blocking<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        self.run_on(&self.current(), f)
    }

    fn current(&self) -> Arc<Slot> {
        Arc::clone(&self.slot.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Leave `slot` to the call blocked on it: later calls get a new
    /// connection.
    fn abandon(&self, slot: &Arc<Slot>) {
        slot.abandoned.store(true, Ordering::SeqCst);
        let mut current = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::ptr_eq(&current, slot) {
            *current = Arc::default();
            if let Some(limit) = self.limit {
                tracing::warn!(
                    "a database call got no answer within {limit:?}: giving up its connection (the link to the database may be cut); the next call opens a new one"
                );
            }
        }
    }

    fn run_on<T>(&self, slot: &Slot, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let mut guard = slot.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let (true, Some(limit)) = (slot.abandoned.load(Ordering::SeqCst), self.limit) {
            return Err(StoreError::Stalled(limit));
        }
        let conn = match guard.as_mut() {
            Some(c) => c,
            // Never `Conn::open`: a reconnect must not create an empty
            // SQLite file where the database was.
            None => guard.insert(self.open()?),
        };
        if self.plans == Plans::GenericWhileLarge {
            // A failure here is the connection's: `f` meets it too, and
            // its error is the one to report.
            if let Err(e) = conn.generic_plans_while_large() {
                tracing::debug!(error = %e, "cannot look at the ledger's size");
            }
        }
        let result = f(conn);
        if let Err(e) = &result {
            if e.is_transient() {
                *guard = None;
            }
        }
        result
    }

    fn open(&self) -> Result<Conn> {
        let mut conn = Conn::open_with(&self.url, super::Access::ReadWrite)?;
        if let Some(limit) = self.limit {
            conn.end_idle_transactions_after(limit / 2)?;
        }
        Ok(conn)
    }
}
