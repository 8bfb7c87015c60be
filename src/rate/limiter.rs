//! The worker's side of the shared rate limits (see `store::rates`): which
//! groups a message counts against, a small local stock of leased tokens per
//! group (each with the time it conforms), and the adapted rate: a
//! throttling reply from a relay or domain halves that group's shared rate
//! in the database (every worker leases at it), and clean replies bring it
//! back step by step (see `store::rates::throttle`).
//!
//! Nobody waits here: [`Limiter::try_take`] either takes the tokens of every
//! group of a message at once, or takes none and says which group is short
//! and when its next token is due. The scheduler (`worker::schedule`) parks
//! or defers the message meanwhile, so a throttled group never holds a
//! sender while other mail could flow.

mod mx;
mod setting;
mod stock;

pub use setting::{
    parse_rate, setting, show_rate, show_stored_burst, show_stored_rate, Setting, SettingError,
};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Mutex;

use crate::rate_group::Group as GroupName;
use crate::store::rates::{self, Lease, RateGroup, MAX_LEASE};
use crate::store::Db;
use crate::store::StoreError;

/// How far ahead a lease may reach: tokens conforming within this window are
/// leased together, so the database sees one write per batch.
const LEASE_HORIZON: Duration = Duration::from_millis(50);
/// A leased token not spent this long after its time is dropped, so no
/// worker sits on old tokens and spends them in a burst. Long enough for a
/// busy machine's late timer (the scheduler takes a token when it wakes at
/// its time, and then every token due for the senders queued behind it):
/// at 10 ms, three workers sharing 200/s with two other processes busy on
/// the two cores dropped 114–173 tokens in 14 s (170–181/s sent); at 25 ms,
/// 56 (188/s). Short enough that late tokens add at most 2.5 % of the rate
/// to any window of a second, inside the 5 % that pacing keeps in hand for
/// jitter (see `store::rates`).
const TOKEN_EXPIRY: Duration = Duration::from_millis(25);
/// How often a worker that knows a group is adapted asks the database
/// for a recovery step (the database allows one per step for all).
const RECOVERY_STEP: Duration = Duration::from_millis(rates::RECOVERY_STEP_MS as u64);
/// After a failed lease (database unreachable), ask again after this long.
const LEASE_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Local state of one group in this worker.
struct Local {
    /// Leased tokens not yet spent, each with the time it conforms.
    tokens: stock::Stock,
    /// The database said no token conforms before this: no lease until then.
    wait_until: Instant,
    /// The shared rate is below the configured one (a throttle): clean
    /// replies ask for recovery steps.
    adapted: bool,
    /// Earliest next recovery request.
    next_recovery: Instant,
}

struct Group {
    config: RateGroup,
    local: Mutex<Local>,
    /// Tokens this worker spent in this group (for `status`).
    spent: AtomicU64,
}

/// Why a message may not go now: the group that is short of tokens (the
/// one whose next token is furthest off) and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub group: String,
    pub at: Instant,
}

/// Why a message did not get its tokens in time (see [`Limiter::acquire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Roughly when to try again.
    pub retry_in: Duration,
}

pub struct Limiter {
    db: Arc<Db>,
    relay: String,
    /// Recipient domains' MX hosts, for `mx:` groups.
    mx: mx::MxCache,
    groups: StdMutex<HashMap<String, Arc<Group>>>,
    /// Bumped whenever a group is created, changed or deleted: messages
    /// whose groups were worked out before look them up again.
    generation: AtomicU64,
    /// Campaigns whose groups this worker has read since it met them.
    campaigns_seen: StdMutex<HashSet<i64>>,
    /// Spent totals of groups dropped by a refresh, so usage never goes back.
    spent_of_gone: StdMutex<HashMap<String, u64>>,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn fresh_local() -> Local {
    let now = Instant::now();
    Local {
        tokens: stock::Stock::default(),
        wait_until: now,
        adapted: false,
        next_recovery: now,
    }
}

impl Limiter {
    /// `relay` is this worker's relay as `HOST:PORT` (its group is
    /// `relay:HOST:PORT`); `resolver` the DNS server `mx:` groups ask
    /// (`None`: the system's).
    pub fn new(db: Arc<Db>, relay: &str, resolver: Option<std::net::SocketAddr>) -> Limiter {
        Limiter {
            db,
            relay: GroupName::Relay(relay.to_string()).to_string(),
            mx: mx::MxCache::new(resolver),
            groups: StdMutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            campaigns_seen: StdMutex::new(HashSet::new()),
            spent_of_gone: StdMutex::new(HashMap::new()),
        }
    }

    /// Changes whenever the groups do (see [`Limiter::groups_for`]).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Reload the group definitions. A group whose rate or burst changed
    /// starts afresh (no local stock leased under the old rate is spent);
    /// the others keep their stock and factor.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let rows = self.db.run(rates::list).await?;
        let mut map = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = HashMap::with_capacity(rows.len());
        let mut changed = rows.len() != map.len();
        for config in rows {
            let group = match map.remove(&config.name) {
                // `updated_at`: `rate set` and `rate warmup` mark a change.
                Some(old)
                    if old.config.rate == config.rate
                        && old.config.burst == config.burst
                        && old.config.updated_at == config.updated_at =>
                {
                    old
                }
                old => {
                    changed = true;
                    let spent = old.map_or(0, |g| g.spent.load(Ordering::Relaxed));
                    Arc::new(Group {
                        local: Mutex::new(fresh_local()),
                        spent: AtomicU64::new(spent),
                        config,
                    })
                }
            };
            next.insert(group.config.name.clone(), group);
        }
        let mut gone = self.spent_of_gone.lock().unwrap_or_else(|p| p.into_inner());
        for (name, g) in map.drain() {
            *gone.entry(name).or_default() += g.spent.load(Ordering::Relaxed);
        }
        *map = next;
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Before the first message of a campaign this worker meets: read the
    /// groups again, so a `campaign:` group set just before `enqueue` is
    /// known before that campaign's first message goes.
    pub async fn know_campaign(&self, campaign_id: i64) -> Result<(), StoreError> {
        let seen = self
            .campaigns_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&campaign_id);
        if !seen {
            self.refresh().await?;
            self.campaigns_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(campaign_id);
        }
        Ok(())
    }

    /// The groups a message to `domain` in campaign `campaign` counts
    /// against: this relay's, the campaign's, and the domain's (or the
    /// `domain:*` default), whichever exist. Domains match whatever their
    /// case.
    pub fn groups_for(&self, campaign: &str, domain: &str) -> Vec<String> {
        let map = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        if map.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if map.contains_key(&self.relay) {
            out.push(self.relay.clone());
        }
        let c = GroupName::Campaign(campaign.to_string()).to_string();
        if map.contains_key(&c) {
            out.push(c);
        }
        let d = GroupName::domain(domain).to_string();
        if map.contains_key(&d) {
            out.push(d);
        } else if let Some(mx) = self.mx_group(&map, domain) {
            out.push(mx);
        } else {
            let any = GroupName::AnyDomain.to_string();
            if map.contains_key(&any) {
                out.push(any);
            }
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

    /// Time between two tokens of a group at its configured rate.
    pub fn interval(&self, name: &str) -> Option<Duration> {
        self.group(name)
            .map(|g| Duration::from_micros(g.config.interval_us().max(1) as u64))
    }

    /// Tokens spent by this worker per group since it started.
    pub fn spent(&self) -> HashMap<String, u64> {
        let mut out = self
            .spent_of_gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let groups: Vec<Arc<Group>> = self
            .groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for g in groups {
            *out.entry(g.config.name.clone()).or_default() += g.spent.load(Ordering::Relaxed);
        }
        out
    }

    /// Take `weight` tokens from every one of `names` if each has them now,
    /// or none at all. Never waits for a token; it may lease from the
    /// database (one round trip per group whose local stock ran out).
    pub async fn try_take(&self, names: &[String], weight: u32) -> Result<(), Blocked> {
        let w = weight.max(1) as usize;
        let groups: Vec<Arc<Group>> = names.iter().filter_map(|n| self.group(n)).collect();
        // First fill the local stocks that ran out...
        for g in &groups {
            let mut local = g.local.lock().await;
            let now = Instant::now();
            expire(&mut local, now, w, g.config.rate);
            if local.tokens.len() < w as u64 && local.wait_until <= now {
                self.lease(g, &mut local, w).await;
            }
        }
        // ...then take from all of them, or from none.
        let mut locals = Vec::with_capacity(groups.len());
        for g in &groups {
            locals.push(g.local.lock().await);
        }
        let now = Instant::now();
        let mut short: Option<(usize, Instant)> = None;
        for (i, (g, local)) in groups.iter().zip(locals.iter_mut()).enumerate() {
            expire(local, now, w, g.config.rate);
            let at = match local.tokens.nth(w as u64 - 1) {
                Some(t) => t,
                // A lease is needed first: due when the database said, or
                // at once (the next call leases).
                None => local.wait_until.max(now + Duration::from_millis(1)),
            };
            if at > now && short.is_none_or(|(_, s)| at > s) {
                short = Some((i, at));
            }
        }
        if let Some((i, at)) = short {
            return Err(Blocked {
                group: groups[i].config.name.clone(),
                at,
            });
        }
        for (g, local) in groups.iter().zip(locals.iter_mut()) {
            local.tokens.take(w as u64);
            g.spent.fetch_add(w as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Lease what the horizon holds (at least `w` tokens' worth of asking,
    /// at most [`MAX_LEASE`]: a heavier message gathers over several).
    async fn lease(&self, group: &Group, local: &mut Local, w: usize) {
        let want = lease_size(&group.config).max(w as u32).min(MAX_LEASE);
        let name = group.config.name.clone();
        let lease = self
            .db
            .run(move |c| {
                let horizon = LEASE_HORIZON.as_micros() as i64;
                crate::store::warmups::lease(c, &name, want, now_us(), horizon)
            })
            .await;
        match lease {
            Err(e) => {
                tracing::warn!(error = %e, group = %group.config.name, "cannot lease tokens");
                local.wait_until = Instant::now() + LEASE_ERROR_PAUSE;
            }
            // Deleted meanwhile: no limit until the next refresh drops it.
            Ok(Lease::NoGroup) => {
                local.tokens.push(Instant::now(), Duration::ZERO, w as u64);
            }
            Ok(Lease::Granted {
                count,
                first_at_us,
                interval_us,
            }) => {
                // Spaced wider than the configured rate: a throttle cut it.
                local.adapted = interval_us > group.config.interval_us();
                let offset = first_at_us - now_us();
                local.tokens.push_granted(count, offset, interval_us);
            }
            Ok(Lease::Wait(us)) => {
                local.wait_until = Instant::now() + Duration::from_micros(us.max(100) as u64);
            }
        }
    }

    /// Take `weight` tokens from every group, waiting for them up to
    /// `max_wait` (for callers outside the worker's scheduler, e.g. tests).
    pub async fn acquire(
        &self,
        names: &[String],
        weight: u32,
        max_wait: Duration,
    ) -> Result<(), Throttled> {
        let deadline = Instant::now() + max_wait;
        loop {
            match self.try_take(names, weight).await {
                Ok(()) => return Ok(()),
                Err(b) if b.at > deadline => {
                    return Err(Throttled {
                        retry_in: b.at.saturating_duration_since(Instant::now()),
                    })
                }
                Err(b) => tokio::time::sleep_until(b.at.into()).await,
            }
        }
    }

    /// The relay or a domain throttled us (`reason`: its reply): halve
    /// the shared rate of each of `names` but campaign groups, for every
    /// worker (at most once per interval, see `store::rates::throttle`),
    /// and drop the tokens this worker leased at the old rate.
    pub async fn slow_down(&self, names: &[String], reason: &str) {
        for name in names.iter().filter(|n| !GroupName::is_campaign_name(n)) {
            let Some(group) = self.group(name) else {
                continue;
            };
            {
                let mut local = group.local.lock().await;
                local.tokens = stock::Stock::default();
                local.adapted = true;
                local.next_recovery = Instant::now() + RECOVERY_STEP;
            }
            let (n, why) = (name.clone(), reason.to_string());
            match self
                .db
                .run(move |c| rates::throttle(c, &n, &why, crate::store::now_ms()))
                .await
            {
                Ok(Some(factor)) => {
                    let rate = rates::rate_in_force(group.config.rate) * factor;
                    tracing::warn!(group = %name, rate = %format!("{rate:.1}/s"), reason, "throttled: shared rate halved");
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, group = %name, "cannot halve the shared rate"),
            }
        }
    }

    /// A message went through: ask for a recovery step of each adapted
    /// group (at most once per step from this worker).
    pub async fn success(&self, names: &[String]) {
        for name in names {
            let Some(group) = self.group(name) else {
                continue;
            };
            {
                let mut local = group.local.lock().await;
                let now = Instant::now();
                if !local.adapted || now < local.next_recovery {
                    continue;
                }
                local.next_recovery = now + RECOVERY_STEP;
            }
            // The database is asked without holding the group: senders
            // take tokens meanwhile.
            let n = name.clone();
            let recovered = self
                .db
                .run(move |c| rates::recover(c, &n, crate::store::now_ms()))
                .await;
            match recovered {
                Ok(Some(factor)) => group.local.lock().await.adapted = factor < 1.0,
                Ok(None) => group.local.lock().await.adapted = false,
                Err(e) => {
                    tracing::warn!(error = %e, group = %name, "cannot recover the shared rate")
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

/// Drop tokens whose time is long past (see [`expiry`]). A message that
/// needs several tokens (`w` > 1) lets them gather instead, or it could
/// never collect them from a slow group.
fn expire(local: &mut Local, now: Instant, w: usize, rate: f64) {
    if w > 1 {
        return;
    }
    if let Some(cutoff) = now.checked_sub(expiry(rate)) {
        local.tokens.drop_before(cutoff);
    }
}

/// How late a leased token may still be spent: [`TOKEN_EXPIRY`], or a
/// fortieth of the gap between two tokens if that is longer. The share of
/// the rate late tokens can add stays the same (2.5 %), and a slow group
/// does not lose a token to a late timer: at two a minute, one dropped
/// token is a 30 s gap where the schedule has none.
fn expiry(rate: f64) -> Duration {
    let gap = if rate > 0.0 { 1.0 / rate } else { 0.0 };
    Duration::try_from_secs_f64(gap / 40.0)
        .unwrap_or(Duration::ZERO)
        .max(TOKEN_EXPIRY)
}

/// Tokens asked for per lease: what the horizon holds at the full rate,
/// never more than [`MAX_LEASE`] (whatever rate a row holds).
fn lease_size(g: &RateGroup) -> u32 {
    let n = (g.rate * LEASE_HORIZON.as_secs_f64()).ceil();
    if n.is_finite() {
        (n as u32).clamp(1, MAX_LEASE)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_groups_tokens_keep_longer_than_a_fast_ones() {
        // 200/s: tokens 5 ms apart, the fixed 25 ms.
        assert_eq!(expiry(200.0), TOKEN_EXPIRY);
        // One every two seconds: 50 ms.
        assert_eq!(expiry(0.5), Duration::from_millis(50));
        // Two a minute: tokens 30 s apart, 750 ms.
        let slow = expiry(2.0 / 60.0).as_secs_f64();
        assert!((slow - 0.75).abs() < 1e-6, "{slow}");
        // One a second: 25 ms either way.
        assert_eq!(expiry(1.0), TOKEN_EXPIRY);
        // A rate no group holds still gives a finite expiry.
        assert_eq!(expiry(0.0), TOKEN_EXPIRY);
        assert_eq!(expiry(f64::MIN_POSITIVE), TOKEN_EXPIRY);
    }
}
