//! Bounded pools for `serve`'s blocking work (database calls, beanstalkd
//! commands), one per side of the trust split. Each side has its own
//! database connection and at most a few threads; a request that finds
//! them all busy waits for one without holding a thread. So nothing the
//! admin side does (a dashboard polling a hung beanstalkd, a slow resume)
//! can take a thread or a connection a one-click unsubscribe needs, and
//! the process's thread count has a ceiling however long a beanstalkd
//! server hangs while a dashboard polls it.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::store::{Conn, Db, StoreError};

/// Threads the public routes' blocking work may use at once.
pub const PUBLIC_THREADS: usize = 8;
/// Threads the admin routes' blocking work may use at once.
pub const ADMIN_THREADS: usize = 4;
/// Threads `/healthz`'s probes may use at once.
pub const HEALTH_THREADS: usize = 2;
/// Campaigns `/api/v1` enqueues in the background at once, each on a
/// blocking thread of its own.
pub const API_ENQUEUES: usize = 4;
/// Database connections `/api/v1` checks keys and stores messages on
/// (see `api::DbPool`), each used from one blocking thread at a time.
pub const API_CONNECTIONS: usize = 4;
/// The runtime's ceiling on blocking threads: the pools' sum and a spare.
pub const MAX_BLOCKING_THREADS: usize =
    PUBLIC_THREADS + ADMIN_THREADS + HEALTH_THREADS + API_ENQUEUES + API_CONNECTIONS + 2;

#[derive(Debug, thiserror::Error)]
#[error("{pool} task failed: {why}")]
pub struct PoolError {
    pool: &'static str,
    why: String,
}

/// At most `threads` blocking tasks at once.
pub struct Pool {
    name: &'static str,
    permits: Arc<Semaphore>,
}

impl Pool {
    pub fn new(name: &'static str, threads: usize) -> Pool {
        Pool {
            name,
            permits: Arc::new(Semaphore::new(threads.max(1))),
        }
    }

    fn failed(&self, why: impl ToString) -> PoolError {
        PoolError {
            pool: self.name,
            why: why.to_string(),
        }
    }

    /// Wait (holding no thread) for room in the pool.
    async fn permit(&self) -> Result<OwnedSemaphorePermit, PoolError> {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|e| self.failed(e))
    }

    /// Run `f` on a blocking thread once the pool has room. The slot is
    /// held by the thread, so a caller that stops waiting (a timeout, a
    /// closed connection) frees it only when `f` returns.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permit = self.permit().await?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        })
        .await
        .map_err(|e| self.failed(e))
    }
}

/// One side of `serve`: its own database connection and its own pool.
pub struct Side {
    db: Arc<Db>,
    pub pool: Pool,
}

impl Side {
    pub fn new(db: Arc<Db>, pool: Pool) -> Side {
        Side { db, pool }
    }

    /// Run `f` on this side's connection, in this side's pool.
    pub async fn db<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn) -> Result<T, StoreError> + Send + 'static,
    {
        let permit = self
            .pool
            .permit()
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?;
        self.db
            .run(move |c| {
                let _permit = permit;
                f(c)
            })
            .await
    }
}
