//! The MX rollup's cache: each recipient domain's preferred MX host,
//! looked up once per TTL whatever the number of messages (concurrent
//! askers share one lookup), in a bounded map. A lookup runs in its own
//! task: a message waits for it at most [`MX_WAIT`], then goes in its
//! domain's own group while the answer still arrives for the next ones.
//! A failed or timed-out lookup, or a domain without MX, counts as no
//! rollup for [`NEGATIVE_TTL`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use tokio::sync::watch;

use crate::dns::{self, Found};
use crate::rate_group::Group as GroupName;

use super::{Group, Limiter};

/// The longest a message waits for its domain's MX answer before it goes
/// without the rollup.
pub const MX_WAIT: Duration = Duration::from_millis(500);
/// The longest one lookup may take (the resolver's retries included).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long no answer (failure, timeout, no MX) is kept.
const NEGATIVE_TTL: Duration = Duration::from_secs(60);
/// The longest an answer is kept, whatever its TTL.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Domains held at most; beyond, the expired go first, then any.
const MAX_DOMAINS: usize = 10_000;

/// One domain's answer: its preferred MX host (`None`: no rollup), and
/// until when it holds. `None` in the channel: still being looked up.
type Answer = Option<(Option<String>, Instant)>;

pub struct MxCache {
    /// Built on first use, once; `Err`: the resolver cannot be set up
    /// (every lookup fails, said once in the log).
    resolver: std::sync::OnceLock<Result<Arc<TokioResolver>, String>>,
    server: Option<SocketAddr>,
    domains: Mutex<HashMap<String, watch::Receiver<Answer>>>,
}

impl MxCache {
    /// Lookups go to `server`, or the system's resolvers.
    pub fn new(server: Option<SocketAddr>) -> MxCache {
        MxCache {
            resolver: std::sync::OnceLock::new(),
            server,
            domains: Mutex::new(HashMap::new()),
        }
    }

    /// The preferred MX host of `domain` if known now (never waits).
    pub fn cached(&self, domain: &str) -> Option<String> {
        let map = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        let answer = map.get(domain)?.borrow().clone();
        match answer {
            Some((host, until)) if until > Instant::now() => host,
            _ => None,
        }
    }

    /// Start looking `domain` up unless its answer is held or on its way;
    /// the receiver of its answer.
    pub fn look_up(&self, domain: &str) -> watch::Receiver<Answer> {
        let mut map = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if let Some(rx) = map.get(domain) {
            let fresh = match &*rx.borrow() {
                Some((_, until)) => *until > now,
                None => true,
            };
            if fresh {
                return rx.clone();
            }
        }
        if map.len() >= MAX_DOMAINS {
            map.retain(|_, rx| rx.borrow().as_ref().is_none_or(|(_, until)| *until > now));
            if map.len() >= MAX_DOMAINS {
                if let Some(k) = map.keys().next().cloned() {
                    map.remove(&k);
                }
            }
        }
        let (tx, rx) = watch::channel(None);
        map.insert(domain.to_string(), rx.clone());
        drop(map);
        let resolver = self.resolver();
        let domain = domain.to_string();
        tokio::spawn(async move {
            let answer = match resolver {
                Ok(r) => lookup(&r, &domain).await,
                Err(_) => (None, Instant::now() + NEGATIVE_TTL),
            };
            let _ = tx.send(Some(answer));
        });
        rx
    }

    /// `domain`'s preferred MX host, waiting for a lookup at most
    /// [`MX_WAIT`].
    pub async fn host(&self, domain: &str) -> Option<String> {
        let mut rx = self.look_up(domain);
        let answer = tokio::time::timeout(MX_WAIT, rx.wait_for(Option::is_some)).await;
        match answer {
            Ok(Ok(a)) => a.as_ref().and_then(|(host, _)| host.clone()),
            _ => None,
        }
    }

    fn resolver(&self) -> Result<Arc<TokioResolver>, String> {
        self.resolver
            .get_or_init(|| {
                dns::resolver(self.server).map(Arc::new).inspect_err(|e| {
                    tracing::warn!(error = %e, "cannot set up the DNS resolver: mx: rate groups apply to no domain; give one with --resolver HOST:PORT");
                })
            })
            .clone()
    }
}

impl Limiter {
    /// The `mx:` group of `domain` (the longest suffix its preferred MX
    /// host ends in), by what the cache holds now.
    pub(super) fn mx_group(
        &self,
        map: &HashMap<String, Arc<Group>>,
        domain: &str,
    ) -> Option<String> {
        let mut suffixes = map
            .keys()
            .filter_map(|k| GroupName::mx_suffix(k))
            .peekable();
        suffixes.peek()?;
        let host = self.mx.cached(&domain.to_lowercase())?;
        suffixes
            .filter(|s| GroupName::mx_matches(&host, s))
            .max_by_key(|s| s.len())
            .map(|s| GroupName::Mx(s.to_string()).to_string())
    }

    /// Whether `domain`'s group may depend on its MX: an `mx:` group
    /// exists and the domain has no group of its own.
    fn needs_mx(&self, domain: &str) -> bool {
        let map = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        map.keys().any(|k| GroupName::mx_suffix(k).is_some())
            && !map.contains_key(&GroupName::domain(domain).to_string())
    }

    /// Start the MX lookups `domains` need for [`Limiter::groups_for`]
    /// (a job's recipients, before their messages), waiting for none.
    pub fn look_up<'a>(&self, domains: impl IntoIterator<Item = &'a str>) {
        for domain in domains {
            if self.needs_mx(domain) {
                let _ = self.mx.look_up(&domain.to_lowercase());
            }
        }
    }

    /// Before [`Limiter::groups_for`]: wait (briefly, see
    /// [`MX_WAIT`]) for `domain`'s MX answer when an `mx:` group may
    /// take it; at once otherwise.
    pub async fn resolve(&self, domain: &str) {
        if self.needs_mx(domain) {
            self.mx.host(&domain.to_lowercase()).await;
        }
    }
}

/// Ask, bounded by [`LOOKUP_TIMEOUT`]: the preferred host and its TTL.
async fn lookup(resolver: &TokioResolver, domain: &str) -> (Option<String>, Instant) {
    let negative = Instant::now() + NEGATIVE_TTL;
    match tokio::time::timeout(LOOKUP_TIMEOUT, dns::mx(resolver, domain)).await {
        Ok((Found::Records(hosts), until)) if !hosts.is_empty() => {
            let until = until.unwrap_or(negative).min(Instant::now() + MAX_TTL);
            (hosts.into_iter().next(), until)
        }
        Ok((Found::Error(e), _)) => {
            tracing::info!(domain, error = %e, "MX lookup failed: the domain's own rate group applies");
            (None, negative)
        }
        Err(_) => {
            tracing::info!(
                domain,
                "MX lookup timed out: the domain's own rate group applies"
            );
            (None, negative)
        }
        Ok(_) => (None, negative),
    }
}
