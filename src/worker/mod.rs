//! `mailsplit worker`: the long-running process that turns queued jobs into
//! delivered mail. Inside, a pipeline of bounded stages, read in this order:
//!
//! 1. [`reserve`]: one thread per beanstalkd server reserves jobs while a job
//!    slot is free and applies delete/release/bury/touch commands;
//! 2. [`job`]: per job, pause/cancel check, ledger claim, render, compose;
//! 3. [`send`]: `--concurrency` SMTP sessions, each on its own connection;
//! 4. [`report`]: outcomes written to the ledger in batches; a job is
//!    deleted or released only once all its outcomes are durable.
//!
//! [`shutdown`] turns SIGTERM, SIGINT and "my binary was replaced" into one
//! stop signal: no more reserving, jobs in flight finish within the grace
//! period (or their unsent messages are handed back), then exit 0.

pub mod db;
pub mod job;
pub mod report;
pub mod reserve;
pub mod send;
pub mod shutdown;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::cli::{open_migrated, Global, WorkerArgs};
use crate::config::{self, SmtpUrl};
use crate::mail::Relay;
use job::{Campaigns, Shared, FLAG_REFRESH};

/// Checked worker settings.
pub struct Settings {
    pub database_url: String,
    pub servers: Vec<SocketAddr>,
    pub tube: String,
    pub relay: Relay,
    pub concurrency: usize,
    pub max_attempts: i32,
    pub grace: Duration,
    pub smtp_timeout: Duration,
}

/// Jobs a worker holds at once: enough to keep every SMTP session busy
/// while the next job is being claimed and rendered.
fn job_slots(concurrency: usize) -> usize {
    concurrency.div_ceil(crate::config::DEFAULT_BATCH_SIZE) * 2 + 1
}

pub fn run_cli(g: &Global, args: &WorkerArgs) -> Result<ExitCode> {
    let url = SmtpUrl::parse(&args.smtp)?;
    let settings = Settings {
        database_url: g.database_url.clone(),
        servers: config::parse_beanstalkd(&g.beanstalkd)?,
        tube: {
            config::check_tube(&g.tube)?;
            g.tube.clone()
        },
        relay: Relay::new(
            url,
            Duration::from_secs(config::check_range(
                "--smtp-timeout",
                args.smtp_timeout as usize,
                1,
                3_600,
            )? as u64),
        )?,
        smtp_timeout: Duration::from_secs(args.smtp_timeout),
        concurrency: config::check_range("--concurrency", args.concurrency, 1, 5_000)?,
        max_attempts: config::check_range(
            "--max-attempts",
            args.max_attempts.max(0) as usize,
            1,
            100,
        )? as i32,
        grace: Duration::from_secs(args.grace),
    };
    // Fail now, with the fix named, if the database is wrong or unmigrated.
    let conn = open_migrated(g)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(settings, conn))?;
    Ok(ExitCode::SUCCESS)
}

/// Run the worker until it is told to stop.
pub async fn run(settings: Settings, conn: crate::store::Conn) -> Result<()> {
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let drained = CancellationToken::new();
    shutdown::on_signals(stop.clone()).context("cannot install signal handlers")?;
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let _watcher = shutdown::on_binary_change(exe.clone(), stop.clone())
        .with_context(|| format!("cannot watch {} for deploys", exe.display()))?;

    let slots_total = job_slots(settings.concurrency);
    let slots = Arc::new(Semaphore::new(slots_total));
    let (jobs_tx, mut jobs_rx) = mpsc::channel(1);
    let (send_tx, send_rx) = async_channel::bounded(settings.concurrency);
    let (report_tx, report_rx) = mpsc::channel(settings.concurrency * 2 + 100);

    let mut cmd_txs = Vec::new();
    let mut threads = Vec::new();
    for (index, &addr) in settings.servers.iter().enumerate() {
        let (tx, rx) = std::sync::mpsc::channel();
        cmd_txs.push(tx);
        let server = reserve::ServerLoop {
            index,
            addr,
            tube: settings.tube.clone(),
            jobs: jobs_tx.clone(),
            cmds: rx,
            slots: Arc::clone(&slots),
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
    drop(jobs_tx);

    let db = db::Db::new(&settings.database_url, Some(conn));
    let limiter = crate::ratelimit::Limiter::new(Arc::clone(&db), settings.relay.target());
    limiter.refresh().await.context("cannot read rate groups")?;
    let shared = Arc::new(Shared {
        db,
        limiter,
        unrecorded: Arc::new(Semaphore::new(settings.concurrency)),
        campaigns: Campaigns::default(),
        cmds: cmd_txs,
        to_send: send_tx,
        to_report: report_tx.clone(),
        max_attempts: settings.max_attempts,
    });

    let mut senders = Vec::new();
    for _ in 0..settings.concurrency {
        senders.push(tokio::spawn(send::sender(
            Arc::clone(&shared),
            send_rx.clone(),
            report_tx.clone(),
            settings.relay.clone(),
            abort.clone(),
        )));
    }
    drop(report_tx);
    let reporter = tokio::spawn(report::reporter(
        Arc::clone(&shared),
        report_rx,
        drained.clone(),
        (settings.concurrency / 4).max(1),
    ));

    let refresher = {
        let shared = Arc::clone(&shared);
        let stop = drained.clone();
        tokio::spawn(async move {
            for round in 1u64.. {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(FLAG_REFRESH) => {}
                }
                if let Err(e) = shared.campaigns.refresh(&shared.db).await {
                    tracing::warn!(error = %e, "cannot refresh campaign flags");
                }
                // Rate groups change rarely: every fourth round (2 s).
                if round % 4 == 0 {
                    if let Err(e) = shared.limiter.refresh().await {
                        tracing::warn!(error = %e, "cannot refresh rate groups");
                    }
                }
            }
        })
    };
    let dispatcher = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            while let Some(job) = jobs_rx.recv().await {
                tokio::spawn(job::handle(Arc::clone(&shared), job));
            }
        })
    };

    tracing::info!(
        relay = settings.relay.target(),
        concurrency = settings.concurrency,
        beanstalkd = ?settings.servers,
        tube = %settings.tube,
        "worker started"
    );
    stop.cancelled().await;

    // Stop: no new jobs. Wait for every slot to come back, i.e. every job
    // finished and its outcomes recorded.
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
    drained.cancel();
    let _ = refresher.await;
    shared.to_send.close();
    for s in senders {
        let _ = tokio::time::timeout(Duration::from_secs(3), s).await;
    }
    dispatcher.abort();
    drop(shared);
    let _ = tokio::time::timeout(Duration::from_secs(5), reporter).await;
    tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await
    .context("reserve threads")?;
    tracing::info!("worker stopped");
    Ok(())
}
