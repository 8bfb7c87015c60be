//! What the worker's stages share: the database, the limiter, the
//! campaigns' flags, the channels between stages and the counters the
//! heartbeat reports.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use tokio::sync::{mpsc, Semaphore};

use super::flags::Campaigns;
use super::optout::Optouts;
use super::pipeline::{Msg, SendOutcome, Urgent};
use super::reserve::Cmd;
use super::schedule::{self, Scheduler};
use super::tracker::Deferrals;
use crate::compose::content::Cache;
use crate::config::WorkerSettings;
use crate::mail::Relay;
use crate::rate::limiter::Limiter;
use crate::store::{Conn, Db, Plans};
use crate::tokens::Identity;

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
    pub scheduler: Arc<Scheduler>,
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
    pub deferrals: Deferrals,
    /// Transactional messages (see `message`) to the senders, which take
    /// them before any campaign message, on their pooled sessions.
    pub urgent: async_channel::Sender<Urgent>,
    /// `concurrency` permits: a transactional message holds one from just
    /// before it is marked `sending` until its outcome is recorded, so at most
    /// that many are ever `sending` unanswered here (all a `kill -9` can
    /// leave failed as in doubt), however many message jobs are at hand.
    pub on_wire: Arc<tokio::sync::Semaphore>,
    /// Message templates compiled, by (template id, version): once per
    /// version, not per message.
    pub templates: Arc<crate::compose::content::Cache>,
}

/// The channels between the stages, made before the stages that hold
/// their other ends.
pub struct Channels {
    pub cmds: Vec<std::sync::mpsc::Sender<Cmd>>,
    pub to_send: async_channel::Sender<Msg>,
    pub to_report: mpsc::Sender<SendOutcome>,
    pub urgent: async_channel::Sender<Urgent>,
}

impl Shared {
    /// The worker's shared state on `conn` (the connection its start
    /// checked) and `identity`, with the rate groups read once.
    pub async fn new(
        settings: &WorkerSettings,
        (conn, identity): (Conn, Identity),
        relay: &Relay,
        scheduler: Arc<Scheduler>,
        channels: Channels,
    ) -> anyhow::Result<Shared> {
        let db = Db::bounded(
            &settings.database_url,
            Some(conn),
            Plans::GenericWhileLarge,
            super::db_call_limit(),
        )?;
        let limiter = Limiter::new(Arc::clone(&db), relay.target(), settings.resolver);
        limiter.refresh().await.context("cannot read rate groups")?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Shared {
            db,
            identity,
            foreign: Mutex::new(Default::default()),
            foreign_jobs: Default::default(),
            tube: settings.tube.clone(),
            limiter,
            scheduler,
            unrecorded: Arc::new(Semaphore::new(settings.concurrency)),
            signers: Arc::new(Semaphore::new(cores)),
            campaigns: Campaigns::new(settings.max_message),
            optouts: Default::default(),
            cmds: channels.cmds,
            to_send: channels.to_send,
            to_report: channels.to_report,
            max_attempts: settings.max_attempts,
            sent: Default::default(),
            deferrals: Default::default(),
            urgent: channels.urgent,
            on_wire: Arc::new(Semaphore::new(settings.concurrency)),
            templates: Arc::new(Cache::with_max_message(settings.max_message)),
        })
    }

    /// Tell the thread of server `server` what to do with one of its jobs.
    pub fn cmd(&self, server: usize, cmd: Cmd) {
        if let Some(tx) = self.cmds.get(server) {
            // A closed channel means the server thread is gone; the job
            // returns to the queue by itself when its connection closes.
            let _ = tx.send(cmd);
        }
    }

    /// What the scheduler reads of this state.
    pub fn schedule(&self) -> schedule::Context<'_> {
        schedule::Context {
            limiter: &self.limiter,
            campaigns: &self.campaigns,
            to_report: &self.to_report,
        }
    }
}
