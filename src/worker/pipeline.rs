//! What travels between the worker's stages: a message to a sender, an
//! outcome to the reporter.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::tracker::Tracker;
use crate::mail::Composed;
use crate::store::OutcomeKind;

/// One message on its way to a sender.
pub struct Msg {
    pub tracker: Arc<Tracker>,
    pub recipient_id: i64,
    /// Which try this is (1 for the first).
    pub attempt: i32,
    pub composed: Composed,
    /// The content version it was composed with (0: none stored): a
    /// message of an older version than the campaign's now is handed back
    /// unsent, and composed anew.
    pub content_version: i64,
    /// Rate groups the message counts against, and its weight in tokens.
    pub rate_groups: Vec<String>,
    pub weight: u32,
    /// What the groups are worked out from, and the limiter's generation
    /// they were worked out under (see `schedule`).
    pub campaign_name: String,
    pub domain: String,
    pub rate_generation: u64,
}

/// One outcome on its way to the reporter.
pub struct SendOutcome {
    pub tracker: Arc<Tracker>,
    pub recipient_id: i64,
    pub attempt: i32,
    pub kind: OutcomeKind,
    /// The content version of the message that went out (see
    /// [`crate::store::Outcome::content_version`]).
    pub content_version: Option<i64>,
    /// For a message that went to the relay: one of the worker's
    /// `concurrency` "unrecorded" permits, held until the outcome is
    /// committed. So at any moment at most `concurrency` messages are on the
    /// wire or sent-but-unrecorded: all a `kill -9` can make us send twice.
    pub unrecorded: Option<OwnedSemaphorePermit>,
}
