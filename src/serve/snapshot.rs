//! One look at everything the admin routes show (dashboard, `/metrics`,
//! `/api/…`): the campaigns with their counters, the rate groups, the
//! worker fleet (three small database reads, O(campaigns + groups +
//! workers), never a scan of the ledger), and the tube's counts on every
//! beanstalkd server (`stats-tube`, asked of all servers at once, each
//! bounded by [`QUEUE_TIMEOUT`]).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use super::State;
use crate::campaign::status::{self, CampaignStatus};
use crate::queue::timed::Timed;
use crate::store::{campaigns, engagement, now_ms, rates, workers, StoreError};
use crate::worker::fleet::{self, Fleet};

/// Longest a snapshot waits for one beanstalkd server's answer.
pub const QUEUE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// When it was taken, ms since the epoch.
    pub at: i64,
    pub campaigns: Vec<CampaignStatus>,
    pub rates: Vec<RateView>,
    pub fleet: Fleet,
    pub queues: Vec<QueueView>,
    /// Opens and clicks this `serve` could not queue for recording.
    pub unrecorded: u64,
}

/// A rate group: its configured and observed rate.
#[derive(Debug, Clone, Serialize)]
pub struct RateView {
    pub name: String,
    /// Configured tokens per second.
    pub limit: f64,
    /// The same as `rate set` takes it (`200/s`, `1/h`), or why a stored
    /// value out of range is not in force.
    pub shown: String,
    pub burst: i64,
    /// Tokens granted per second lately (0 when idle).
    pub observed: f64,
    /// Tokens granted in total.
    pub granted: i64,
}

/// The tube on one beanstalkd server.
#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    pub server: SocketAddr,
    pub tube: String,
    /// `None` when the server could not be asked; see `error`.
    pub counts: Option<TubeCounts>,
    pub error: Option<String>,
}

/// A tube's `stats-tube` counts (all 0 when the tube does not exist yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TubeCounts {
    pub ready: u64,
    pub reserved: u64,
    pub delayed: u64,
    pub buried: u64,
    /// Connections watching the tube: roughly, workers attached.
    pub watching: u64,
}

impl TubeCounts {
    /// The job states, as `/metrics` labels them.
    pub fn by_state(&self) -> [(&'static str, u64); 4] {
        [
            ("ready", self.ready),
            ("reserved", self.reserved),
            ("delayed", self.delayed),
            ("buried", self.buried),
        ]
    }
}

/// Take a snapshot.
pub async fn take(state: &State) -> Result<Snapshot, StoreError> {
    let db = state.admin.db(|c| {
        let list = campaigns::list(c)?;
        let ids: Vec<i64> = list.iter().map(|(c, _)| c.id).collect();
        let engaged = engagement::counts(c, &ids)?;
        Ok((list, engaged, rates::list(c)?, workers::list(c)?))
    });
    let (db, queues) = tokio::join!(db, queues(state));
    let (campaigns, engaged, groups, workers) = db?;
    let at = now_ms();
    Ok(Snapshot {
        at,
        unrecorded: state
            .tracking
            .recorder
            .unrecorded
            .load(std::sync::atomic::Ordering::Relaxed),
        campaigns: campaigns
            .iter()
            .map(|(c, counters)| {
                let mut status = CampaignStatus::new(c, counters);
                status.engagement = engaged.get(&c.id).copied().unwrap_or_default();
                status
            })
            .collect(),
        rates: groups
            .iter()
            .map(|g| RateView {
                name: g.name.clone(),
                limit: g.rate,
                shown: crate::rate::limiter::show_stored_rate(g.rate),
                burst: g.burst,
                observed: (status::observed_rate(g) * 10.0).round() / 10.0,
                granted: g.leased,
            })
            .collect(),
        fleet: fleet::view(workers, at),
        queues,
    })
}

async fn queues(state: &State) -> Vec<QueueView> {
    let tube = &state.settings.tube;
    // All servers at once: one slow server costs QUEUE_TIMEOUT, not one each.
    let mut asks = tokio::task::JoinSet::new();
    for (i, &addr) in state.settings.servers.iter().enumerate() {
        let (state, tube) = (std::sync::Arc::clone(state), tube.clone());
        asks.spawn(async move { (i, ask(&state, addr, tube).await) });
    }
    let mut answers = asks.join_all().await;
    answers.sort_by_key(|(i, _)| *i);
    state
        .settings
        .servers
        .iter()
        .zip(answers)
        .map(|(&server, (_, (counts, error)))| QueueView {
            server,
            tube: tube.clone(),
            counts,
            error,
        })
        .collect()
}

/// One server's counts for the tube, or why there are none: asked on an
/// admin thread, every step under QUEUE_TIMEOUT (a hung server frees the
/// thread when it runs out), waiting for a free thread counted too.
async fn ask(
    state: &State,
    addr: SocketAddr,
    tube: String,
) -> (Option<TubeCounts>, Option<String>) {
    let stats = state.admin.pool.blocking(move || {
        Timed::connect(addr, QUEUE_TIMEOUT).and_then(|mut s| s.stats_tube(&tube))
    });
    match tokio::time::timeout(2 * QUEUE_TIMEOUT, stats).await {
        Ok(Ok(Ok(stats))) => (Some(counts(&stats)), None),
        Ok(Ok(Err(e))) => (None, Some(cause_chain(&e))),
        Ok(Err(e)) => (None, Some(e.to_string())),
        Err(_) => (
            None,
            Some(format!("no answer within {:?}", 2 * QUEUE_TIMEOUT)),
        ),
    }
}

/// `error: cause: cause`, as the command line prints errors.
pub fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn counts(stats: &std::collections::HashMap<String, String>) -> TubeCounts {
    let get = |key: &str| {
        stats
            .get(key)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    TubeCounts {
        ready: get("current-jobs-ready"),
        reserved: get("current-jobs-reserved"),
        delayed: get("current-jobs-delayed"),
        buried: get("current-jobs-buried"),
        watching: get("current-watching"),
    }
}
