//! The worker's view of its campaigns: what every message of a campaign
//! shares (loaded once) and its pause/cancel flags, refreshed from the
//! database every [`FLAG_REFRESH`](crate::config::FLAG_REFRESH) so a pause takes effect within a second,
//! also when it was set by hand with SQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::RwLock;

use crate::compose::{CampaignMail, ComposeError};
use crate::queue;
use crate::store::campaigns::{self, Flags};
use crate::store::{CampaignState, Db, StoreError};
use crate::tokens::Identity;

/// A campaign's fixed settings, loaded once per worker.
pub struct CampaignInfo {
    pub mail: CampaignMail,
    /// beanstalkd priority of its jobs.
    pub priority: u32,
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
    flags: RwLock<HashMap<i64, FlagState>>,
}

impl Campaigns {
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
        let identity = identity.clone();
        let loaded = db
            .run(move |conn| {
                let Some(c) = campaigns::get(conn, id)? else {
                    return Ok(None);
                };
                // A stored key that does not load, like a bad sender, is an
                // error the job comes back from later, not unsigned mail.
                let mail = CampaignMail::load(conn, &c, &identity).map_err(|e| match e {
                    ComposeError::Store(e) => e,
                    ComposeError::Dkim(e) => StoreError::BadValue {
                        what: "DKIM key",
                        value: e.to_string(),
                    },
                    _ => StoreError::BadValue {
                        what: "sender address",
                        value: c.from_addr.clone(),
                    },
                })?;
                Ok(Some((c, mail)))
            })
            .await?;
        let Some((c, mail)) = loaded else {
            return Ok(None);
        };
        let info = Arc::new(CampaignInfo {
            mail,
            priority: queue::priority(c.priority),
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

    /// Reload the flags of every campaign this worker has seen.
    pub async fn refresh(&self, db: &Arc<Db>) -> Result<(), StoreError> {
        let ids: Vec<i64> = self.flags.read().await.keys().copied().collect();
        if ids.is_empty() {
            return Ok(());
        }
        for (id, flags) in db.run(move |c| campaigns::flags(c, &ids)).await? {
            self.set_flags(id, flags).await;
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

    /// Whether no more mail may go out for this campaign now.
    pub async fn blocked(&self, id: i64) -> bool {
        self.flags
            .read()
            .await
            .get(&id)
            .is_some_and(|f| f.flags.paused || f.flags.state == CampaignState::Cancelled)
    }

    pub async fn flag_state(&self, id: i64) -> Option<FlagState> {
        self.flags.read().await.get(&id).copied()
    }
}
