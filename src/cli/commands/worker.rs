//! `mailsplit worker`: the command line owns the runtime and the shutdown
//! signal (SIGTERM, SIGINT, the binary replaced by a deploy); the worker
//! stage runs until that signal trips.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::cli::args::{Global, WorkerArgs};
use crate::cli::resolve::worker_settings;
use crate::shutdown;
use crate::worker::{self, WorkerError};

use super::Result;

/// Run a worker until it is told to stop.
pub fn worker(g: &Global, args: &WorkerArgs) -> Result {
    let settings = worker_settings(g, args)?;
    // One thread runs the SMTP sessions, the scheduler and the reporter:
    // they only wait on sockets and hand work on, and on one thread a
    // wake-up is a queue push, where tokio's multi-threaded scheduler paid
    // for cross-thread wake-ups, work stealing and its locks on every
    // message (BENCHMARKS.md, "A worker's CPU, cut by cut"). The CPU work
    // (rendering, signing, the database) runs on the blocking pool, on
    // every core.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .map_err(WorkerError::Run)?;
    let stop = CancellationToken::new();
    let result = runtime.block_on(async {
        // Kept alive until the worker returns.
        let _watcher = install(stop.clone()).map_err(WorkerError::Run)?;
        worker::run(settings, stop).await
    });
    // Wait for the runtime's threads before the process exits: exit runs
    // the C libraries' clean-up (OpenSSL's, under libpq's TLS), and a
    // thread still closing a PostgreSQL connection beside it crashed a
    // worker with SIGSEGV after "worker stopped". The wait is bounded: a
    // database call the worker gave up on (its link went silent) may
    // still be blocked on its thread, and must not keep the process from
    // exiting, which dropping the runtime would (it waits for every
    // blocking task).
    runtime.shutdown_timeout(WIND_DOWN);
    Ok(result?)
}

/// How long an exiting worker waits for its runtime's threads to end.
const WIND_DOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// Trip `stop` on SIGTERM, SIGINT, and when this executable is replaced.
fn install(stop: CancellationToken) -> anyhow::Result<notify::RecommendedWatcher> {
    shutdown::on_signals(stop.clone()).context("cannot install signal handlers")?;
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    shutdown::on_binary_change(exe.clone(), stop)
        .with_context(|| format!("cannot watch {} for deploys", exe.display()))
}
