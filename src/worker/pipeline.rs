//! What travels between the worker's stages: a message to a sender, an
//! outcome to the reporter.

use std::sync::Arc;

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::tracker::Tracker;
use crate::mail::{Composed, Verdict};
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

/// A transactional message on its way to a sender: it goes ahead of every
/// campaign message, on one of the senders' pooled sessions, so it takes a
/// session within `--concurrency` and the relay's connection limits rather
/// than a connect of its own. Its rate tokens are taken already.
pub struct Urgent {
    pub composed: Composed,
    /// Where the sender answers.
    pub reply: oneshot::Sender<Delivered>,
}

/// A sender's answer for an [`Urgent`] message.
pub struct Delivered {
    /// The relay's verdict; `None`: not handed to the relay (the worker is
    /// aborting and its senders hold no session).
    pub verdict: Option<Verdict>,
    /// For a message that went to the relay: one of the `concurrency`
    /// "unrecorded" permits (see [`SendOutcome::unrecorded`]), held by the
    /// message's handler until its outcome is recorded.
    pub unrecorded: Option<OwnedSemaphorePermit>,
}
