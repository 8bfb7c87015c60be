//! The worker's side of the shared rate limits (see `store::rates`): which
//! groups a message counts against, a small local stock of leased tokens per
//! group, pacing each token to its conforming time, and an adaptive factor
//! that halves a relay's or domain's local rate when it says "slow down" and
//! lets it recover step by step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Mutex;

use crate::store::rates::{self, Lease, RateGroup};
use crate::store::Db;
use crate::store::StoreError;

/// How far ahead a lease may reach: tokens conforming within this window are
/// leased together, so the database sees one write per batch.
const LEASE_HORIZON: Duration = Duration::from_millis(50);
/// A leased token not spent this long after its time is dropped, so no
/// worker sits on old tokens and spends them in a burst.
const TOKEN_EXPIRY: Duration = Duration::from_millis(5);
/// Slowest the adaptive factor goes (1/32 of the configured rate).
const MIN_FACTOR: f64 = 1.0 / 32.0;
/// The factor grows back by a quarter per second without a slow-down reply.
const RECOVERY_STEP: Duration = Duration::from_secs(1);

/// Local state of one group in this worker.
struct Local {
    /// Leased tokens not yet spent.
    left: u32,
    /// When the next leased token conforms.
    next_at: Instant,
    interval: Duration,
    /// Adaptive share of the configured rate this worker uses (≤ 1).
    factor: f64,
    /// Earliest next spend under the adaptive factor.
    paced_until: Instant,
    last_change: Instant,
}

struct Group {
    config: RateGroup,
    local: Mutex<Local>,
}

/// Why a message may not go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Roughly when to try again.
    pub retry_in: Duration,
}

pub struct Limiter {
    db: Arc<Db>,
    relay: String,
    groups: StdMutex<HashMap<String, Arc<Group>>>,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Limiter {
    /// `relay` is this worker's relay as `HOST:PORT` (its group is
    /// `relay:HOST:PORT`).
    pub fn new(db: Arc<Db>, relay: &str) -> Limiter {
        Limiter {
            db,
            relay: format!("relay:{relay}"),
            groups: StdMutex::new(HashMap::new()),
        }
    }

    /// Reload the group definitions (a `rate set` takes effect within one
    /// refresh; local stocks and factors survive it).
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let rows = self.db.run(rates::list).await?;
        let mut map = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = HashMap::with_capacity(rows.len());
        for config in rows {
            let group = match map.remove(&config.name) {
                Some(old) if old.config.rate == config.rate && old.config.burst == config.burst => {
                    old
                }
                _ => Arc::new(Group {
                    local: Mutex::new(Local {
                        left: 0,
                        next_at: Instant::now(),
                        interval: Duration::ZERO,
                        factor: 1.0,
                        paced_until: Instant::now(),
                        last_change: Instant::now(),
                    }),
                    config,
                }),
            };
            next.insert(group.config.name.clone(), group);
        }
        *map = next;
        Ok(())
    }

    /// The groups a message to `domain` in campaign `campaign` counts
    /// against: this relay's, the campaign's, and the domain's (or the
    /// `domain:*` default), whichever exist.
    pub fn groups_for(&self, campaign: &str, domain: &str) -> Vec<String> {
        let map = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        if map.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if map.contains_key(&self.relay) {
            out.push(self.relay.clone());
        }
        let c = format!("campaign:{campaign}");
        if map.contains_key(&c) {
            out.push(c);
        }
        let d = format!("domain:{}", domain.to_ascii_lowercase());
        if map.contains_key(&d) {
            out.push(d);
        } else if map.contains_key("domain:*") {
            out.push("domain:*".to_string());
        }
        out
    }

    fn group(&self, name: &str) -> Option<Arc<Group>> {
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Take `weight` tokens from every group, waiting for them up to
    /// `max_wait`. Tokens taken from earlier groups are spent even when a
    /// later one refuses: the limits stay limits, at worst a little unused.
    pub async fn acquire(
        &self,
        names: &[String],
        weight: u32,
        max_wait: Duration,
    ) -> Result<(), Throttled> {
        let deadline = Instant::now() + max_wait;
        for name in names {
            let Some(group) = self.group(name) else {
                continue;
            };
            for _ in 0..weight.max(1) {
                self.take_one(&group, deadline).await?;
            }
        }
        Ok(())
    }

    async fn take_one(&self, group: &Group, deadline: Instant) -> Result<(), Throttled> {
        let mut local = group.local.lock().await;
        loop {
            let now = Instant::now();
            // Drop tokens whose time is long past (see TOKEN_EXPIRY).
            while local.left > 0 && local.next_at + TOKEN_EXPIRY < now {
                local.left -= 1;
                let step = local.interval;
                local.next_at += step;
            }
            if local.left > 0 {
                let at = local.next_at.max(local.paced_until);
                if at > deadline {
                    return Err(Throttled { retry_in: at - now });
                }
                tokio::time::sleep_until(at.into()).await;
                local.left -= 1;
                let step = local.interval;
                local.next_at += step;
                if local.factor < 1.0 {
                    local.paced_until = Instant::now() + step.div_f64(local.factor);
                }
                return Ok(());
            }
            let want = lease_size(&group.config);
            let name = group.config.name.clone();
            let lease = self
                .db
                .run(move |c| {
                    rates::lease(c, &name, want, now_us(), LEASE_HORIZON.as_micros() as i64)
                })
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, group = %group.config.name, "cannot lease tokens");
                    Throttled {
                        retry_in: Duration::from_secs(1),
                    }
                })?;
            match lease {
                Lease::NoGroup => return Ok(()),
                Lease::Granted {
                    count,
                    first_at_us,
                    interval_us,
                } => {
                    // Measured from after the lease's round trip: from
                    // `now` (before it), a first token due at once looked
                    // older than TOKEN_EXPIRY on a database slower than
                    // 5 ms and was dropped unspent.
                    let (at, offset) = (Instant::now(), first_at_us - now_us());
                    local.next_at = if offset > 0 {
                        at + Duration::from_micros(offset as u64)
                    } else {
                        at
                    };
                    local.interval = Duration::from_micros(interval_us as u64);
                    local.left = count;
                }
                Lease::Wait(us) => {
                    let wake = now + Duration::from_micros(us.max(100) as u64);
                    if wake > deadline {
                        return Err(Throttled {
                            retry_in: wake - now,
                        });
                    }
                    tokio::time::sleep_until(wake.into()).await;
                }
            }
        }
    }

    /// The relay or a domain said "slow down": halve this worker's share.
    pub async fn slow_down(&self, names: &[String]) {
        for name in names.iter().filter(|n| !n.starts_with("campaign:")) {
            if let Some(group) = self.group(name) {
                let mut local = group.local.lock().await;
                local.factor = (local.factor / 2.0).max(MIN_FACTOR);
                local.last_change = Instant::now();
                tracing::warn!(group = %name, factor = local.factor, "slowing down");
            }
        }
    }

    /// A message went through: recover a step if the last change is old.
    pub async fn success(&self, names: &[String]) {
        for name in names {
            if let Some(group) = self.group(name) {
                let mut local = group.local.lock().await;
                if local.factor < 1.0 && local.last_change.elapsed() >= RECOVERY_STEP {
                    local.factor = (local.factor * 1.25).min(1.0);
                    local.last_change = Instant::now();
                }
            }
        }
    }
}

/// Rate tokens one message costs: one, plus one per started 256 KiB, so
/// large messages count for more against a relay's budget.
pub fn message_weight(bytes: usize) -> u32 {
    1 + (bytes / (256 * 1024)) as u32
}

/// Tokens asked for per lease: what the horizon holds at the full rate.
fn lease_size(g: &RateGroup) -> u32 {
    ((g.rate * LEASE_HORIZON.as_secs_f64()).ceil() as u32).max(1)
}

/// Parse `200/s`, `5000/m`, `100000/h` (also `per` words) into tokens per
/// second.
pub fn parse_rate(s: &str) -> Option<f64> {
    let (n, unit) = s.trim().split_once('/')?;
    let n: f64 = n.trim().parse().ok()?;
    let per = match unit.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        _ => return None,
    };
    (n > 0.0 && n.is_finite()).then_some(n / per)
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("200/s"), Some(200.0));
        assert_eq!(parse_rate("60/m"), Some(1.0));
        assert_eq!(parse_rate("3600/h"), Some(1.0));
        assert_eq!(parse_rate("0/s"), None);
        assert_eq!(parse_rate("10/d"), None);
        assert_eq!(parse_rate("fast"), None);
    }
}
