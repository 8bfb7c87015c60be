//! `/healthz` on the public listener: 200 `ok` only when the database
//! answers on the public side's connection and every beanstalkd server
//! answers a command, each within [`PROBE_TIMEOUT`]; otherwise 503 with a
//! line per part that did not: a hung beanstalkd must not look healthy to
//! a load balancer. One probe runs at a time and its answer is reused for
//! [`FRESH_FOR`], so polling `/healthz` cannot multiply the probes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::Mutex;

use super::pool::{Pool, HEALTH_THREADS};
use super::State;
use crate::queue::timed::Timed;

/// Longest a part may take to answer a probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A probe's answer is reused this long.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// What the last probe found: `None` when all is well, else one line per
/// part that failed.
type Found = Option<Vec<String>>;

pub struct Health {
    pool: Pool,
    last: Mutex<Option<(Instant, Found)>>,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            pool: Pool::new("health", HEALTH_THREADS),
            last: Mutex::new(None),
        }
    }
}

/// `GET /healthz`.
pub async fn healthz(Extract(state): Extract<State>) -> Response {
    let found = {
        let mut last = state.health.last.lock().await;
        match &*last {
            Some((at, found)) if at.elapsed() < FRESH_FOR => found.clone(),
            _ => {
                let found = probe(&state).await;
                *last = Some((Instant::now(), found.clone()));
                found
            }
        }
    };
    match found {
        None => "ok\n".into_response(),
        Some(lines) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy\n{}\n", lines.join("\n")),
        )
            .into_response(),
    }
}

async fn probe(state: &State) -> Found {
    let db = tokio::time::timeout(
        PROBE_TIMEOUT,
        state.public.db(|c| c.execute_batch("SELECT 1")),
    );
    let queues = queues(state);
    let (db, queues) = tokio::join!(db, queues);
    let mut failed = Vec::new();
    match db {
        Ok(Ok(())) => {}
        Ok(Err(e)) => failed.push(format!("database: {e}")),
        Err(_) => failed.push(format!("database: no answer within {PROBE_TIMEOUT:?}")),
    }
    failed.extend(queues);
    (!failed.is_empty()).then_some(failed)
}

/// Ask every beanstalkd server at once; a line per one that failed.
async fn queues(state: &State) -> Vec<String> {
    let mut asks = tokio::task::JoinSet::new();
    for &addr in &state.settings.servers {
        let state = std::sync::Arc::clone(state);
        asks.spawn(async move {
            let why = ping(&state, addr).await.err()?;
            Some(format!("beanstalkd {addr}: {why}"))
        });
    }
    let mut failed: Vec<String> = asks.join_all().await.into_iter().flatten().collect();
    failed.sort();
    failed
}

async fn ping(state: &State, addr: SocketAddr) -> Result<(), String> {
    let ask = state
        .health
        .pool
        .blocking(move || Timed::connect(addr, PROBE_TIMEOUT).and_then(|mut s| s.ping()));
    // Connecting and the command each have PROBE_TIMEOUT; waiting for a
    // slot in the pool counts too.
    match tokio::time::timeout(2 * PROBE_TIMEOUT, ask).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(super::snapshot::cause_chain(&e)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {:?}", 2 * PROBE_TIMEOUT)),
    }
}
