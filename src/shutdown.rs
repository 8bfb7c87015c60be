//! One stop signal for every task of a long-running command (`worker`,
//! `serve`): SIGTERM, SIGINT, or the process's own executable being
//! replaced (a deploy) all cancel the same token.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use notify::{RecursiveMode, Watcher};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Trip `stop` on SIGTERM or SIGINT.
pub fn on_signals(stop: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = stop.cancelled() => return,
        };
        // Stop first: a log line must never stand between a signal and the
        // stop (stderr may be a closed pipe).
        stop.cancel();
        tracing::info!("{which} received: finishing work in flight, then exiting");
    });
    Ok(())
}

/// Identity of a file: a deploy by rename changes the inode, a copy over it
/// changes size or modification time.
fn fingerprint(path: &Path) -> Option<(u64, u64, i64, i64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

/// Trip `stop` when the file at `exe` changes. Watches the directory, since a
/// deploy usually renames a new file over the old one. The returned watcher
/// must be kept alive.
pub fn on_binary_change(
    exe: PathBuf,
    stop: CancellationToken,
) -> notify::Result<notify::RecommendedWatcher> {
    let dir = exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let original = fingerprint(&exe);
    let watched = exe.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let ours = event
            .paths
            .iter()
            .any(|p| p == &watched || p.file_name() == watched.file_name());
        if ours && !stop.is_cancelled() && fingerprint(&watched) != original {
            tracing::info!(binary = %watched.display(), "executable replaced: exiting so the supervisor restarts the new one");
            stop.cancel();
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}
