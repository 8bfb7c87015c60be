//! `mailsplit worker`: the long-running process that turns queued jobs into
//! delivered mail. Inside, a pipeline of bounded stages, read in this order:
//!
//! 1. [`reserve`]: one thread per beanstalkd server reserves jobs while a job
//!    slot is free and applies delete/release/bury/touch commands;
//! 2. [`job`]: per job, signature and campaign checks ([`flags`] caches the
//!    campaigns and their pause/cancel flags), ledger claim, compose;
//! 3. [`schedule`]: per rate group, a queue of parked messages; a sender
//!    gets the next message whose tokens are taken, and messages whose
//!    tokens are far off are deferred to new delayed jobs (one per group);
//! 4. [`send`]: `--concurrency` senders, each opening its SMTP session
//!    before it takes a message, within the adaptive session count and the
//!    relay's shared connection limit ([`sessions`]); at most
//!    `--max-per-session` messages per session ([`optout`] skips recipients
//!    who left since their claim);
//! 5. [`record`]: outcomes written to the ledger in batches, each counted
//!    on its job's [`tracker`]; once all of a job's outcomes are durable,
//!    [`fate`] deletes or releases it ([`touch`] keeps it reserved
//!    meanwhile).
//!
//! [`pipeline`] holds the types that travel between the stages, [`shared`]
//! what they share; [`heartbeat`] keeps this worker's row in the fleet
//! table, which [`fleet`] reads for `mailsplit workers`.
//! [`crate::shutdown`] turns SIGTERM, SIGINT and "my binary was replaced" into one
//! stop signal: no more reserving, jobs in flight finish within the grace
//! period (or their unsent messages are handed back), then exit 0.

pub mod ab;
pub mod fate;
pub mod flags;
pub mod fleet;
pub mod heartbeat;
pub mod job;
pub mod lease;
pub mod message;
pub mod optout;
pub mod pipeline;
pub mod record;
pub mod reserve;
pub mod schedule;
pub mod send;
pub mod sessions;
pub mod shared;
pub mod touch;
pub mod tracker;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::{WorkerSettings, FLAG_REFRESH};
use crate::mail::Relay;
use crate::store::{self, installation, Db, Plans};
use crate::tokens::Identity;
use flags::Campaigns;
use shared::Shared;

/// Jobs a worker holds at once: enough to keep every SMTP session busy
/// while the next job is being claimed and rendered.
fn job_slots(concurrency: usize) -> usize {
    concurrency.div_ceil(crate::config::DEFAULT_BATCH_SIZE) * 2 + 1
}

/// Messages parked for rate tokens at once, at most: beyond this, a message
/// whose tokens are not there is deferred rather than held.
fn max_parked(concurrency: usize) -> usize {
    concurrency * 4 + 100
}

/// How long a database call of the worker may go unanswered before its
/// connection is given up (see [`store::db`]): a claim's lease. An answer
/// that comes later comes after the job's fence and after its claims may
/// have passed to another worker, so it serves nothing it was asked for,
/// while waiting on would hold every later call (heartbeat, extensions,
/// outcomes) of this worker.
fn db_call_limit() -> Duration {
    crate::queue::job_ttr()
}

/// Why a worker could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The database is unreachable, unmigrated, or its URL is wrong.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The relay's TLS set-up failed.
    #[error(transparent)]
    Relay(#[from] crate::mail::MailError),
    /// The running pipeline failed.
    #[error(transparent)]
    Run(#[from] anyhow::Error),
}

/// The shutdown phases, in order, each a token every task that cares
/// watches:
///
/// 1. `stop` (the caller's signal: SIGTERM, SIGINT, a deploy, or a test):
///    no new jobs are reserved; jobs in flight go on;
/// 2. `abort` (the grace period is over, or the database file was
///    replaced): senders hand their unsent messages back;
/// 3. `drained` (every job slot is back, or the wait for them gave up):
///    reserve threads, senders, the reporter and the refresher wind down;
/// 4. `leases_done` (every session closed): this worker's shared
///    connection slots go back to the relay's limit.
struct Phases {
    stop: CancellationToken,
    abort: CancellationToken,
    drained: CancellationToken,
    leases_done: CancellationToken,
}

impl Phases {
    fn new(stop: CancellationToken) -> Phases {
        Phases {
            stop,
            abort: CancellationToken::new(),
            drained: CancellationToken::new(),
            leases_done: CancellationToken::new(),
        }
    }
}

/// Check the settings against the world (database schema and identity,
/// relay TLS files), then run the worker until `stop` is cancelled (the
/// caller's shutdown signal, as mini-redis's `server::run` takes one; the
/// command line trips it on SIGTERM, SIGINT and a deploy). Runs on the
/// caller's tokio runtime.
pub async fn run(settings: WorkerSettings, stop: CancellationToken) -> Result<(), WorkerError> {
    // Fail now, with the fix named, if the database is wrong or unmigrated.
    let mut conn = store::open_migrated(&settings.database_url)?;
    // The file just opened: checked at every flag refresh.
    let db_file = store::DbFile::of(&settings.database_url);
    let identity = Identity::from(&installation::load(&mut conn)?);
    let relay = Relay::new(settings.smtp.clone(), settings.smtp_timeout)?;
    let phases = Phases::new(stop);
    Ok(pipeline_run(settings, relay, identity, conn, db_file, phases).await?)
}

/// Run the worker until it is told to stop.
async fn pipeline_run(
    settings: WorkerSettings,
    relay: Relay,
    identity: Identity,
    conn: store::Conn,
    db_file: Option<store::DbFile>,
    phases: Phases,
) -> Result<()> {
    let Phases {
        stop,
        abort,
        drained,
        leases_done,
    } = phases;

    let slots_total = job_slots(settings.concurrency);
    let slots = Arc::new(Semaphore::new(slots_total));
    let (jobs_tx, mut jobs_rx) = mpsc::channel(1);
    let (send_tx, send_rx) = async_channel::bounded(settings.concurrency);
    let (urgent_tx, urgent_rx) = async_channel::bounded(settings.concurrency);
    let scheduler = Arc::new(schedule::Scheduler::new(
        (send_rx, urgent_rx),
        max_parked(settings.concurrency),
        abort.clone(),
    ));
    let (report_tx, report_rx) = mpsc::channel(settings.concurrency * 2 + 100);

    let (cmd_txs, threads) = spawn_reservers(
        &settings,
        crate::queue::home_tube(&identity.database_id),
        &jobs_tx,
        &slots,
        &stop,
        &drained,
    )?;
    drop(jobs_tx);

    let db = Db::bounded(
        &settings.database_url,
        Some(conn),
        Plans::GenericWhileLarge,
        db_call_limit(),
    )?;
    let limiter = crate::rate::limiter::Limiter::new(Arc::clone(&db), relay.target());
    limiter.refresh().await.context("cannot read rate groups")?;
    let shared = Arc::new(Shared {
        db,
        identity,
        foreign: Mutex::new(Default::default()),
        foreign_jobs: Default::default(),
        tube: settings.tube.clone(),
        limiter,
        scheduler: Arc::clone(&scheduler),
        unrecorded: Arc::new(Semaphore::new(settings.concurrency)),
        signers: Arc::new(Semaphore::new(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        )),
        campaigns: Campaigns::new(settings.max_message),
        optouts: Default::default(),
        cmds: cmd_txs,
        to_send: send_tx,
        to_report: report_tx.clone(),
        max_attempts: settings.max_attempts,
        sent: Default::default(),
        deferrals: Default::default(),
        urgent: urgent_tx,
        templates: Arc::new(crate::compose::content::Cache::with_max_message(
            settings.max_message,
        )),
    });
    let heartbeat = heartbeat::Heartbeat::start(
        Arc::clone(&shared),
        relay.target(),
        settings.concurrency,
        stop.clone(),
    );

    let sessions = sessions::Sessions::new(relay.target(), settings.concurrency);
    let leasing = sessions.start_leasing(Arc::clone(&shared.db), leases_done.clone());
    let senders = spawn_senders(
        &settings,
        &relay,
        &sessions,
        &shared,
        &scheduler,
        &report_tx,
        &(abort.clone(), drained.clone()),
    );
    drop(report_tx);
    let reporter = tokio::spawn(record::reporter(
        Arc::clone(&shared),
        report_rx,
        drained.clone(),
        (settings.concurrency / 4).max(1),
    ));

    let refresher = spawn_refresher(&shared, db_file, &drained, &stop, &abort);
    let dispatcher = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            while let Some(job) = jobs_rx.recv().await {
                let shared = Arc::clone(&shared);
                // A transactional message's job, or a campaign's.
                if crate::queue::message::is_message_job(&job.body) {
                    tokio::spawn(message::handle(shared, job));
                } else {
                    tokio::spawn(job::handle(shared, job));
                }
            }
        })
    };

    let deliverer = tokio::spawn(crate::webhooks::deliver::run(
        Db::bounded(&settings.database_url, None, Plans::Custom, db_call_limit())?,
        settings.webhooks,
        stop.clone(),
    ));
    // Flow steps: one worker at a time holds the scheduler's lease.
    let flows = tokio::spawn(crate::flows::scheduler::run(
        Db::bounded(&settings.database_url, None, Plans::Custom, db_call_limit())?,
        crate::messages::Queue {
            servers: settings.servers.clone(),
            tube: settings.tube.clone(),
        },
        stop.clone(),
    ));
    log_started(&settings, &relay);
    stop.cancelled().await;

    finish_jobs(&settings, &slots, slots_total, &abort).await;
    drained.cancel();
    let fatal = refresher.await.ok().flatten();
    Tasks {
        senders,
        leases_done,
        leasing,
        dispatcher,
        reporter,
        heartbeat,
        threads,
    }
    .wind_down(shared)
    .await?;
    // It stops with `stop`, giving up its leases.
    let _ = tokio::time::timeout(Duration::from_secs(5), deliverer).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), flows).await;
    if let Some(e) = fatal {
        return Err(e.into());
    }
    log_signing();
    tracing::info!("worker stopped");
    Ok(())
}

/// The DKIM signatures this worker made and their CPU time: what
/// `scripts/bench.sh --dkim-compare` sets beside `openssl speed`.
fn log_signing() {
    let (signatures, cpu) = crate::dkim::signing_cpu();
    if signatures > 0 {
        let per = cpu.as_secs_f64() * 1e6 / signatures as f64;
        tracing::info!(
            signatures,
            cpu_ms = cpu.as_millis() as u64,
            cpu_us_per_signature = format_args!("{per:.1}"),
            "DKIM signing CPU"
        );
    }
}

/// The reserve threads' command channels and the threads.
type Reservers = (
    Vec<std::sync::mpsc::Sender<reserve::Cmd>>,
    Vec<std::thread::JoinHandle<()>>,
);

/// One reserve thread per beanstalkd server; returns the senders of their
/// command channels (delete, release, bury, touch) and the threads.
fn spawn_reservers(
    settings: &WorkerSettings,
    home: Option<String>,
    jobs_tx: &mpsc::Sender<reserve::Incoming>,
    slots: &Arc<Semaphore>,
    stop: &CancellationToken,
    drained: &CancellationToken,
) -> Result<Reservers> {
    let mut cmd_txs = Vec::new();
    let mut threads = Vec::new();
    for (index, &addr) in settings.servers.iter().enumerate() {
        let (tx, rx) = std::sync::mpsc::channel();
        cmd_txs.push(tx);
        let server = reserve::ServerLoop {
            index,
            addr,
            tube: settings.tube.clone(),
            home: home.clone(),
            jobs: jobs_tx.clone(),
            cmds: rx,
            slots: Arc::clone(slots),
            stop: stop.clone(),
            drained: drained.clone(),
        };
        threads.push(
            std::thread::Builder::new()
                .name(format!("beanstalkd-{addr}"))
                .spawn(move || server.run())
                .context("cannot start a reserve thread")?,
        );
    }
    Ok((cmd_txs, threads))
}

/// Every [`FLAG_REFRESH`]: the campaigns' flags, recent unsubscribes and
/// the rate groups; and the SQLite file, whose replacement stops the
/// worker (the task then returns the error).
fn spawn_refresher(
    shared: &Arc<Shared>,
    db_file: Option<store::DbFile>,
    drained: &CancellationToken,
    stop: &CancellationToken,
    abort: &CancellationToken,
) -> tokio::task::JoinHandle<Option<store::StoreError>> {
    let shared = Arc::clone(shared);
    let drained = drained.clone();
    let (stop, abort) = (stop.clone(), abort.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = drained.cancelled() => return None,
                _ = tokio::time::sleep(FLAG_REFRESH) => {}
            }
            // SQLite file deleted or replaced: nobody will ever read
            // what this worker records, so send nothing more (unsent
            // messages are handed back, jobs released) and fail.
            if let Some(Err(e)) = db_file.as_ref().map(store::DbFile::check) {
                tracing::error!("{e}");
                abort.cancel();
                stop.cancel();
                return Some(e);
            }
            if let Err(e) = shared.campaigns.refresh(&shared.db).await {
                tracing::warn!(error = %e, "cannot refresh campaign flags");
            }
            // A `dkim delete` stops signing within a round.
            if let Err(e) = shared.campaigns.refresh_keys(&shared.db).await {
                tracing::warn!(error = %e, "cannot re-read DKIM keys");
            }
            if let Err(e) = shared.optouts.refresh(&shared.db).await {
                tracing::warn!(error = %e, "cannot read recent unsubscribes");
            }
            // A `rate set` takes effect within a round (one small read).
            if let Err(e) = shared.limiter.refresh().await {
                tracing::warn!(error = %e, "cannot refresh rate groups");
            }
        }
    })
}

/// `--concurrency` sender tasks, each with its own SMTP session.
fn spawn_senders(
    settings: &WorkerSettings,
    relay: &Relay,
    sessions: &Arc<sessions::Sessions>,
    shared: &Arc<Shared>,
    scheduler: &Arc<schedule::Scheduler>,
    report_tx: &mpsc::Sender<pipeline::SendOutcome>,
    // The `abort` and `drained` phases a sender watches.
    (abort, drained): &(CancellationToken, CancellationToken),
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..settings.concurrency)
        .map(|_| {
            let setup = send::SenderSetup {
                relay: relay.clone(),
                sessions: Arc::clone(sessions),
                max_per_session: settings.max_per_session,
                abort: abort.clone(),
                done: drained.clone(),
            };
            tokio::spawn(send::sender(
                Arc::clone(shared),
                Arc::clone(scheduler),
                report_tx.clone(),
                setup,
            ))
        })
        .collect()
}

/// Phase 1 → 2: wait for every job slot to come back (every job finished
/// and its outcomes recorded) within the grace period; past it, `abort`
/// (senders hand back what they have not sent) and wait a last while.
async fn finish_jobs(
    settings: &WorkerSettings,
    slots: &Semaphore,
    slots_total: usize,
    abort: &CancellationToken,
) {
    let all = slots_total as u32;
    if tokio::time::timeout(settings.grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(grace = ?settings.grace, "grace period over: handing back unsent messages");
        abort.cancel();
        if tokio::time::timeout(
            settings.smtp_timeout + Duration::from_secs(5),
            slots.acquire_many(all),
        )
        .await
        .is_err()
        {
            tracing::error!("jobs still unfinished; exiting anyway (beanstalkd returns them, their claims lapse after the TTR)");
        }
    }
}

fn log_started(settings: &WorkerSettings, relay: &Relay) {
    tracing::info!(
        relay = relay.target(),
        concurrency = settings.concurrency,
        max_per_session = settings.max_per_session,
        beanstalkd = ?settings.servers,
        tube = %settings.tube,
        "worker started"
    );
}

/// The tasks and threads a running worker winds down once `drained`.
struct Tasks {
    senders: Vec<tokio::task::JoinHandle<()>>,
    leases_done: CancellationToken,
    leasing: tokio::task::JoinHandle<()>,
    dispatcher: tokio::task::JoinHandle<()>,
    reporter: tokio::task::JoinHandle<()>,
    heartbeat: heartbeat::Heartbeat,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Tasks {
    /// Phases 3 and 4: senders close their sessions, the connection slots
    /// go back, the reporter flushes, the heartbeat row goes, the reserve
    /// threads end.
    async fn wind_down(self, shared: Arc<Shared>) -> Result<()> {
        shared.to_send.close();
        shared.urgent.close();
        for s in self.senders {
            let _ = tokio::time::timeout(Duration::from_secs(3), s).await;
        }
        // Every session closed: this worker's connection slots go back.
        self.leases_done.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.leasing).await;
        self.dispatcher.abort();
        drop(shared);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.reporter).await;
        self.heartbeat.finish().await;
        tokio::task::spawn_blocking(move || {
            for t in self.threads {
                let _ = t.join();
            }
        })
        .await
        .context("reserve threads")?;
        Ok(())
    }
}
