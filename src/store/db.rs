//! A database handle for async code (the worker, `serve`): one connection
//! used from blocking tasks, re-opened after it fails with a
//! connection-type error, so a database restart costs a few retries instead
//! of the process.

use std::sync::{Arc, Mutex};

use super::{Conn, Result, StoreError};

pub struct Db {
    url: String,
    conn: Mutex<Option<Conn>>,
    plans: Plans,
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
        Arc::new(Db {
            url: url.to_string(),
            conn: Mutex::new(conn),
            plans,
        })
    }

    /// Run `f` on the connection in a blocking task.
    pub async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn) -> Result<T> + Send + 'static,
    {
        let db = Arc::clone(self);
        tokio::task::spawn_blocking(move || db.run_blocking(f))
            .await
            .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))
    }

    /// Run `f` on the connection on this thread (a thread of its own).
    pub fn run_blocking<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let conn = match guard.as_mut() {
            Some(c) => c,
            // Never `Conn::open`: a reconnect must not create an empty
            // SQLite file where the database was.
            None => guard.insert(Conn::open_with(&self.url, super::Access::ReadWrite)?),
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
}
