//! The worker's view of its campaigns: what every message of a campaign
//! shares (loaded once) and its pause/cancel flags, refreshed from the
//! database every [`FLAG_REFRESH`](crate::config::FLAG_REFRESH) so a pause takes effect within a second,
//! also when it was set by hand with SQL. The From domains' DKIM keys are
//! re-read as often ([`Campaigns::refresh_keys`]): after `dkim delete` of
//! a leaked key, a new key or `dkim activate`, the next message is signed
//! accordingly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::RwLock;

use crate::compose::content::Cache;
use crate::compose::{CampaignMail, ComposeError};
use crate::dkim::SigningKey;
use crate::queue;
use crate::store::campaigns::{self, Flags};
use crate::store::content as stored;
use crate::store::dkim_keys::{self, KeyState, StoredKey};
use crate::store::{CampaignState, Db, StoreError};
use crate::tokens::Identity;

/// A campaign's fixed settings, loaded once per worker.
pub struct CampaignInfo {
    pub mail: CampaignMail,
    /// beanstalkd priority of its jobs.
    pub priority: u32,
    /// Its A/B test, if it has one.
    pub ab: Option<Arc<super::ab::AbPlan>>,
    /// The DKIM keys `mail` signs with, as (selector, created_at), sorted:
    /// what a refresh compares with the stored keys.
    keys: Vec<(String, i64)>,
}

/// The (selector, created_at) of a domain's stored keys, sorted.
fn key_versions<'a>(keys: impl Iterator<Item = &'a StoredKey>) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = keys.map(|k| (k.selector.clone(), k.created_at)).collect();
    v.sort();
    v
}

/// A stored key that does not load, like a bad sender, is an error the
/// job comes back from later, not unsigned mail.
fn load_error(e: ComposeError, from: &str) -> StoreError {
    match e {
        ComposeError::Store(e) => e,
        ComposeError::Dkim(e) => StoreError::BadValue {
            what: "DKIM key",
            value: e.to_string(),
        },
        ComposeError::Content(e) => StoreError::BadValue {
            what: "campaign content",
            value: e.to_string(),
        },
        _ => StoreError::BadValue {
            what: "sender address",
            value: from.to_string(),
        },
    }
}

#[derive(Clone, Copy)]
pub struct FlagState {
    pub flags: Flags,
    /// Since when this worker has seen the campaign paused.
    pub paused_since: Option<Instant>,
}

/// Campaign settings and flags, see the module documentation.
#[derive(Default)]
pub struct Campaigns {
    info: Mutex<HashMap<i64, Arc<CampaignInfo>>>,
    /// Compiled content by (campaign, version): once per worker.
    content: Arc<Cache>,
    flags: RwLock<HashMap<i64, FlagState>>,
    /// The newest content version of each campaign, as of the last
    /// refresh: a message composed with an older one is not sent.
    versions: Mutex<HashMap<i64, i64>>,
}

/// A campaign as [`Campaigns::info`] loads it.
type Loaded = (
    crate::store::Campaign,
    CampaignMail,
    Vec<(String, i64)>,
    Option<Arc<super::ab::AbPlan>>,
);

impl CampaignInfo {
    /// The mail of variant `variant` (A when `None` or unknown).
    pub fn mail_for(&self, variant: Option<i64>) -> &CampaignMail {
        match (variant, &self.ab) {
            (Some(v), Some(plan)) if v >= 1 => {
                plan.others.get(v as usize - 1).unwrap_or(&self.mail)
            }
            _ => &self.mail,
        }
    }
}

/// Load a campaign's settings, its current content compiled (from `cache`)
/// and its DKIM keys; `None` if it does not exist.
async fn load(
    db: &Arc<Db>,
    identity: &Identity,
    cache: &Arc<Cache>,
    id: i64,
) -> Result<Option<Loaded>, StoreError> {
    let identity = identity.clone();
    let cache = Arc::clone(cache);
    db.run(move |conn| {
        let Some(c) = campaigns::get(conn, id)? else {
            return Ok(None);
        };
        let mail = CampaignMail::load_cached(conn, &c, &identity, &cache)
            .map_err(|e| load_error(e, &c.from_addr))?;
        let keys = key_versions(dkim_keys::for_domain(conn, &mail.domain)?.iter());
        let ab = super::ab::load(conn, &c, &mail)
            .map_err(|e| load_error(e, &c.from_addr))?
            .map(Arc::new);
        Ok(Some((c, mail, keys, ab)))
    })
    .await
}

impl Campaigns {
    /// No campaign loaded yet; their messages are capped at `max_message`
    /// bytes.
    pub fn new(max_message: usize) -> Campaigns {
        Campaigns {
            content: Arc::new(Cache::with_max_message(max_message)),
            ..Campaigns::default()
        }
    }

    /// The campaign, loading it on first sight; `None` if it does not exist.
    pub async fn info(
        &self,
        db: &Arc<Db>,
        identity: &Identity,
        id: i64,
    ) -> Result<Option<Arc<CampaignInfo>>, StoreError> {
        if let Some(found) = self.info.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Ok(Some(Arc::clone(found)));
        }
        let Some((c, mail, keys, ab)) = load(db, identity, &self.content, id).await? else {
            return Ok(None);
        };
        let info = Arc::new(CampaignInfo {
            mail,
            priority: queue::priority(c.priority),
            keys,
            ab,
        });
        self.info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&info));
        self.set_flags(
            id,
            Flags {
                state: c.state,
                paused: c.paused,
                send_at: c.send_at,
            },
        )
        .await;
        Ok(Some(info))
    }

    async fn set_flags(&self, id: i64, flags: Flags) {
        let mut map = self.flags.write().await;
        let paused_since = match map.get(&id) {
            Some(old) if flags.paused => old.paused_since.or(Some(Instant::now())),
            _ if flags.paused => Some(Instant::now()),
            _ => None,
        };
        map.insert(
            id,
            FlagState {
                flags,
                paused_since,
            },
        );
    }

    /// Reload the flags of every campaign this worker has seen, and the
    /// settings of those edited since (`campaign edit`). The content
    /// versions are read after the flags and in use before the flags are:
    /// an edit is only stored while the campaign is paused, so the refresh
    /// that first sees it resumed sends the new version from its first
    /// message.
    pub async fn refresh(&self, db: &Arc<Db>) -> Result<(), StoreError> {
        let ids: Vec<i64> = self.flags.read().await.keys().copied().collect();
        if ids.is_empty() {
            return Ok(());
        }
        let asked = ids.clone();
        let flags = db.run(move |c| campaigns::flags(c, &asked)).await?;
        let versions = db.run(move |c| stored::latest_versions(c, &ids)).await?;
        for (id, version) in versions {
            self.versions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, version);
            self.reload_if_edited(db, id, version).await;
        }
        for (id, flags) in flags {
            self.set_flags(id, flags).await;
        }
        Ok(())
    }

    /// Load the campaign again if its content is newer than this worker's.
    async fn reload_if_edited(&self, db: &Arc<Db>, id: i64, version: i64) {
        let Some(old) = self.current(id) else {
            return;
        };
        if old.mail.content_version >= version {
            return;
        }
        match load(db, &old.mail.identity, &self.content, id).await {
            Ok(Some((c, mail, keys, ab))) => {
                tracing::info!(
                    campaign = %mail.name,
                    version = mail.content_version,
                    "campaign edited; sending its new content version from now on"
                );
                let fresh = Arc::new(CampaignInfo {
                    mail,
                    priority: queue::priority(c.priority),
                    keys,
                    ab,
                });
                self.info
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, fresh);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(campaign = id, error = %e, "cannot load an edited campaign; its messages wait until it loads");
            }
        }
    }

    /// Whether a message composed with content `version` is older than the
    /// campaign's newest version as of the last refresh.
    pub fn outdated(&self, id: i64, version: i64) -> bool {
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .is_some_and(|&newest| version < newest)
    }

    /// The campaign's settings as this worker knows them now (with the
    /// keys of the last refresh); `None` before its first job.
    pub fn current(&self, id: i64) -> Option<Arc<CampaignInfo>> {
        self.info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Re-read the DKIM keys of every campaign this worker has seen (one
    /// small read); a campaign whose From domain's keys changed signs its
    /// next message with the keys stored now, or not at all. A new key
    /// that does not load leaves the campaign as it was, with a warning.
    pub async fn refresh_keys(&self, db: &Arc<Db>) -> Result<(), StoreError> {
        let seen: Vec<(i64, Arc<CampaignInfo>)> = self
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, info)| (*id, Arc::clone(info)))
            .collect();
        if seen.is_empty() {
            return Ok(());
        }
        let stored = db.run(dkim_keys::list).await?;
        for (id, info) in seen {
            let mut keys: Vec<&StoredKey> = stored
                .iter()
                .filter(|k| k.domain == info.mail.domain && k.state == KeyState::Active)
                .collect();
            let versions = key_versions(keys.iter().copied());
            if versions == info.keys {
                continue;
            }
            keys.sort_by_key(|k| k.algorithm);
            let loaded: Result<Vec<_>, _> = keys.iter().map(|k| SigningKey::cached(k)).collect();
            let dkim = match loaded {
                Ok(dkim) => dkim,
                Err(e) => {
                    tracing::warn!(domain = %info.mail.domain, error = %e, "cannot load a changed DKIM key; signing as before");
                    continue;
                }
            };
            tracing::info!(
                campaign = %info.mail.name,
                domain = %info.mail.domain,
                keys = dkim.len(),
                "DKIM keys changed; signing with the stored ones from now on"
            );
            let mut mail = info.mail.clone();
            mail.dkim = dkim.into();
            let ab = info.ab.as_ref().map(|p| Arc::new(p.with_dkim(&mail.dkim)));
            let fresh = Arc::new(CampaignInfo {
                mail,
                priority: info.priority,
                keys: versions,
                ab,
            });
            self.info
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, fresh);
        }
        Ok(())
    }

    /// The campaign's flags read from the database now (not from the
    /// cache), which they then replace; `None` if it no longer exists.
    pub async fn fresh_flags(&self, db: &Arc<Db>, id: i64) -> Result<Option<Flags>, StoreError> {
        let found = db.run(move |c| campaigns::flags(c, &[id])).await?;
        let Some(&(_, flags)) = found.first() else {
            return Ok(None);
        };
        self.set_flags(id, flags).await;
        Ok(Some(flags))
    }

    /// Whether no more mail may go out for this campaign now: paused,
    /// cancelled, or its start time ahead (moved later by an edit).
    pub async fn blocked(&self, id: i64) -> bool {
        self.flags.read().await.get(&id).is_some_and(|f| {
            f.flags.paused
                || f.flags.state == CampaignState::Cancelled
                || f.flags.before_start(crate::store::now_ms())
        })
    }

    pub async fn flag_state(&self, id: i64) -> Option<FlagState> {
        self.flags.read().await.get(&id).copied()
    }
}
