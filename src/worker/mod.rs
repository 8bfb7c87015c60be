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
mod start;
pub mod touch;
pub mod tracker;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerSettings;
use crate::mail::Relay;
use crate::store::{self, installation};
use crate::tokens::Identity;
use start::start;

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
    let slots_total = job_slots(settings.concurrency);
    let slots = Arc::new(Semaphore::new(slots_total));
    let (shared, tasks) = start(
        &settings,
        &relay,
        (conn, identity, db_file),
        &slots,
        &phases,
    )
    .await?;
    log_started(&settings, &relay);
    phases.stop.cancelled().await;

    finish_jobs(&settings, &slots, slots_total, &phases.abort).await;
    phases.drained.cancel();
    tasks.wind_down(shared).await?;
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
