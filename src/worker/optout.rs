//! Recipients who left while their message was on its way. The job stage
//! reads each recipient's status when it claims the job, but a composed
//! message can wait in the senders' queue, or for rate tokens, for seconds
//! after that. So every flag refresh this cache reads the recipients whose
//! status changed since the last one (a one-click unsubscribe from `serve`,
//! a bounce), and each sender checks it right before sending: a recipient
//! who unsubscribes is recorded `skipped` within a refresh, also when the
//! message was already composed.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::store::{now_ms, optouts, Db, RecipientStatus, StoreError};

/// Rows read per refresh at most; a larger wave of changes is read over
/// several refreshes.
const PAGE: i64 = 1_000;
/// Changes are re-read this far back from the newest one seen, so a writer
/// whose clock is a little behind (another machine's `serve`) is not
/// missed.
const SKEW_MS: i64 = 5_000;
/// At start, changes this old are read: nothing composed by this worker
/// is older.
const START_BACK_MS: i64 = 60_000;
/// How long an entry is kept: longer than any message waits between its
/// claim and its send. The claim-time check covers everything after.
const RETAIN: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Seen {
    /// Newest `status_at` read (ms, the writers' clocks).
    newest: i64,
    /// The last read filled a page: continue from `newest` exactly.
    more: bool,
    left: HashMap<i64, (RecipientStatus, Instant)>,
}

/// See the module documentation.
pub struct Optouts {
    seen: RwLock<Seen>,
}

impl Default for Optouts {
    fn default() -> Self {
        Optouts {
            seen: RwLock::new(Seen {
                newest: now_ms() - START_BACK_MS,
                ..Seen::default()
            }),
        }
    }
}

impl Optouts {
    /// Whether the recipient left recently, and as what.
    pub fn left(&self, recipient: i64) -> Option<RecipientStatus> {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        seen.left.get(&recipient).map(|(status, _)| *status)
    }

    /// Read the changes since the last refresh.
    pub async fn refresh(&self, db: &Arc<Db>) -> Result<(), StoreError> {
        let since = {
            let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
            if seen.more {
                seen.newest
            } else {
                seen.newest - SKEW_MS
            }
        };
        let rows = db.run(move |c| optouts::left_since(c, since, PAGE)).await?;
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        seen.more = rows.len() as i64 == PAGE;
        for (id, status, at) in rows {
            seen.newest = seen.newest.max(at);
            seen.left.insert(id, (status, now));
        }
        seen.left
            .retain(|_, (_, when)| now.duration_since(*when) < RETAIN);
        Ok(())
    }
}
