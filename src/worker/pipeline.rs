//! What travels between the worker's stages, and what they share.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::fate::Tracker;
use super::flags::Campaigns;
use super::optout::Optouts;
use super::reserve::Cmd;
use crate::mail::Composed;
use crate::ratelimit::Limiter;
use crate::store::{Db, OutcomeKind};
use crate::tokens::Identity;

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

/// What the stages share.
pub struct Shared {
    pub db: Arc<Db>,
    /// This worker's database: jobs of another are left alone, and every
    /// job's signature is checked with its secret.
    pub identity: Identity,
    pub campaigns: Campaigns,
    /// Recipients who unsubscribed or bounced since their claim.
    pub optouts: Optouts,
    pub cmds: Vec<std::sync::mpsc::Sender<Cmd>>,
    pub to_send: async_channel::Sender<Msg>,
    pub to_report: mpsc::Sender<SendOutcome>,
    pub max_attempts: i32,
    pub limiter: Limiter,
    /// Parked messages per rate group (see `schedule`).
    pub scheduler: Arc<super::schedule::Scheduler>,
    /// `concurrency` permits: a message holds one from before it is sent
    /// until its outcome is committed (see [`SendOutcome::unrecorded`]).
    pub unrecorded: Arc<tokio::sync::Semaphore>,
    /// One permit per core: how many batches of DKIM-signed messages are
    /// composed at once on the blocking pool (see `job::compose_batch`).
    pub signers: Arc<tokio::sync::Semaphore>,
    /// Other databases whose jobs this worker has met (each logged once),
    /// and how many jobs of theirs it moved to their own tubes.
    pub foreign: Mutex<HashSet<String>>,
    pub foreign_jobs: AtomicU64,
    /// The named tube it reserves from (`--tube`), for its heartbeat.
    pub tube: String,
    /// Messages this process recorded as sent (for its heartbeat).
    pub sent: AtomicU64,
    /// Jobs that only deferred recipients, summed for the log.
    pub deferrals: super::fate::Deferrals,
    /// The relay, for transactional messages (see `message`), which go on
    /// a session of their own rather than wait behind the senders' queue.
    pub relay: crate::mail::Relay,
}

impl Shared {
    /// Tell the thread of server `server` what to do with one of its jobs.
    pub fn cmd(&self, server: usize, cmd: Cmd) {
        if let Some(tx) = self.cmds.get(server) {
            // A closed channel means the server thread is gone; the job
            // returns to the queue by itself when its connection closes.
            let _ = tx.send(cmd);
        }
    }
}
