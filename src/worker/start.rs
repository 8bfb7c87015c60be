//! How a worker's stages start (reserve threads, job stage, senders,
//! reporter, refresher and the tasks beside them) and wind down.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::shared::{Channels, Shared};
use super::{
    db_call_limit, heartbeat, job, max_parked, message, pipeline, record, reserve, schedule, send,
    sessions, Phases,
};
use crate::config::{WorkerSettings, FLAG_REFRESH};
use crate::mail::Relay;
use crate::store::{self, Db, Plans};
use crate::tokens::Identity;

/// Start every stage: the reserve threads, the senders, the reporter, the
/// refresher, the dispatcher and the tasks beside them.
pub(super) async fn start(
    settings: &WorkerSettings,
    relay: &Relay,
    (conn, identity, db_file): (store::Conn, Identity, Option<store::DbFile>),
    slots: &Arc<Semaphore>,
    phases: &Phases,
) -> Result<(Arc<Shared>, Tasks)> {
    let Phases { stop, drained, .. } = phases;
    let (jobs_tx, jobs_rx) = mpsc::channel(1);
    let (send_tx, send_rx) = async_channel::bounded(settings.concurrency);
    let (urgent_tx, urgent_rx) = async_channel::bounded(settings.concurrency);
    let scheduler = Arc::new(schedule::Scheduler::new(
        (send_rx, urgent_rx),
        max_parked(settings.concurrency),
        phases.abort.clone(),
    ));
    let (report_tx, report_rx) = mpsc::channel(settings.concurrency * 2 + 100);
    let home = crate::queue::home_tube(&identity.database_id);
    let (cmd_txs, threads) = spawn_reservers(settings, home, &jobs_tx, slots, stop, drained)?;
    drop(jobs_tx);

    let channels = Channels {
        cmds: cmd_txs,
        to_send: send_tx,
        to_report: report_tx.clone(),
        urgent: urgent_tx,
    };
    let scheduled = Arc::clone(&scheduler);
    let shared =
        Arc::new(Shared::new(settings, (conn, identity), relay, scheduled, channels).await?);
    let (senders, leasing, reporter) = spawn_stages(
        settings,
        relay,
        &shared,
        &scheduler,
        (report_tx, report_rx),
        phases,
    );
    let tasks = Tasks {
        refresher: spawn_refresher(&shared, db_file, drained, stop, &phases.abort),
        senders,
        leases_done: phases.leases_done.clone(),
        leasing,
        dispatcher: tokio::spawn(dispatch(Arc::clone(&shared), jobs_rx)),
        reporter,
        heartbeat: heartbeat::Heartbeat::start(
            Arc::clone(&shared),
            relay.target(),
            settings.concurrency,
            stop.clone(),
        ),
        threads,
        background: spawn_background(settings, stop)?,
    };
    Ok((shared, tasks))
}

/// The stages after the job stage: the senders on their sessions (whose
/// connection slots a leasing task holds) and the reporter.
fn spawn_stages(
    settings: &WorkerSettings,
    relay: &Relay,
    shared: &Arc<Shared>,
    scheduler: &Arc<schedule::Scheduler>,
    (report_tx, report_rx): (
        mpsc::Sender<pipeline::SendOutcome>,
        mpsc::Receiver<pipeline::SendOutcome>,
    ),
    phases: &Phases,
) -> (
    Vec<tokio::task::JoinHandle<()>>,
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
) {
    let sessions = sessions::Sessions::new(relay.target(), settings.concurrency);
    let leasing = sessions.start_leasing(Arc::clone(&shared.db), phases.leases_done.clone());
    let ends = (phases.abort.clone(), phases.drained.clone());
    let senders = spawn_senders(
        settings, relay, &sessions, shared, scheduler, &report_tx, &ends,
    );
    drop(report_tx);
    let reporter = tokio::spawn(record::reporter(
        Arc::clone(shared),
        report_rx,
        phases.drained.clone(),
        (settings.concurrency / 4).max(1),
    ));
    (senders, leasing, reporter)
}

/// Hand each reserved job to its stage: a transactional message's, or a
/// campaign's.
async fn dispatch(shared: Arc<Shared>, mut jobs: mpsc::Receiver<reserve::Incoming>) {
    while let Some(job) = jobs.recv().await {
        let shared = Arc::clone(&shared);
        if crate::queue::message::is_message_job(&job.body) {
            tokio::spawn(message::handle(shared, job));
        } else {
            tokio::spawn(job::handle(shared, job));
        }
    }
}

/// The tasks beside the pipeline, each on connections of its own: the
/// webhook deliverer and the flows' scheduler (one worker at a time holds
/// each one's lease). Both stop with `stop`, giving up their leases.
fn spawn_background(
    settings: &WorkerSettings,
    stop: &CancellationToken,
) -> Result<(tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>)> {
    let own_db = || Db::bounded(&settings.database_url, None, Plans::Custom, db_call_limit());
    let deliverer = tokio::spawn(crate::webhooks::deliver::run(
        own_db()?,
        settings.webhooks,
        stop.clone(),
    ));
    let flows = tokio::spawn(crate::flows::scheduler::run(
        own_db()?,
        crate::messages::Queue {
            servers: settings.servers.clone(),
            tube: settings.tube.clone(),
        },
        stop.clone(),
    ));
    Ok((deliverer, flows))
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

/// The tasks and threads a running worker winds down once `drained`.
pub(super) struct Tasks {
    /// Ends with the fatal error that stopped the worker, if one did.
    refresher: tokio::task::JoinHandle<Option<store::StoreError>>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    leases_done: CancellationToken,
    leasing: tokio::task::JoinHandle<()>,
    dispatcher: tokio::task::JoinHandle<()>,
    reporter: tokio::task::JoinHandle<()>,
    heartbeat: heartbeat::Heartbeat,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The webhook deliverer and the flows' scheduler.
    background: (tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>),
}

impl Tasks {
    /// Phases 3 and 4: senders close their sessions, the connection slots
    /// go back, the reporter flushes, the heartbeat row goes, the reserve
    /// threads end.
    pub(super) async fn wind_down(self, shared: Arc<Shared>) -> Result<()> {
        let fatal = self.refresher.await.ok().flatten();
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
        // They stop with `stop`, giving up their leases.
        let (deliverer, flows) = self.background;
        let _ = tokio::time::timeout(Duration::from_secs(5), deliverer).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), flows).await;
        match fatal {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}
