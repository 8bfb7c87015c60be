//! Pause, resume or cancel a campaign: what `mailsplit pause|resume|cancel`
//! and the dashboard's buttons both do. The flip is one write in the
//! database (workers notice within a second); a resume also makes the
//! campaign's delayed jobs ready again, so sending restarts at once instead
//! of after the delays its jobs were released with while paused.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::FLAG_REFRESH;
use crate::queue::timed::Timed;
use crate::queue::QueueError;
use crate::store::campaigns;
pub use crate::store::campaigns::Control;
use crate::store::{installation, Campaign, Conn, StoreError};

/// Most delayed jobs one resume kicks per server.
const KICK_LIMIT: u64 = 1_000_000;
/// Longest a beanstalkd server may take over each command of the kick: a
/// hung server fails the kick instead of holding the caller (the CLI, or
/// one of `serve`'s admin threads) for ever.
pub const QUEUE_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// What a control command did.
#[derive(Debug)]
pub struct Controlled {
    pub campaign: Campaign,
    /// After a resume: per beanstalkd server, how many delayed jobs were
    /// made ready, or why that failed (best effort: without it the jobs
    /// still come back within their delay, at most 2 min).
    pub kicked: Vec<(SocketAddr, Result<u64, QueueError>)>,
}

/// Flip the campaign, refusing transitions that make no sense.
pub fn control(
    conn: &mut Conn,
    servers: &[SocketAddr],
    tube: &str,
    name: &str,
    action: Control,
) -> Result<Controlled, StoreError> {
    let campaign = campaigns::control(conn, name, action)?;
    let mut kicked = Vec::new();
    if action == Control::Resume {
        // Let every worker's flag cache see the resume first, or a worker
        // could meet a kicked job and delay it again.
        std::thread::sleep(2 * FLAG_REFRESH);
        kicked = kick_delayed(conn, servers, tube);
    }
    Ok(Controlled { campaign, kicked })
}

/// Make the tube's delayed jobs ready on every server (also in this
/// database's own tube, where other databases' workers move its jobs):
/// after a resume, or a start time moved earlier (`campaign edit
/// --send-at`), whose jobs were delayed for the old time. Best effort:
/// per server, how many jobs, or why not.
pub fn kick_delayed(
    conn: &mut Conn,
    servers: &[SocketAddr],
    tube: &str,
) -> Vec<(SocketAddr, Result<u64, QueueError>)> {
    let home = installation::load(conn)
        .ok()
        .and_then(|i| crate::queue::home_tube(&i.database_id));
    let tubes: Vec<&str> = std::iter::once(tube).chain(home.as_deref()).collect();
    servers
        .iter()
        .map(|&addr| {
            let n = Timed::connect(addr, QUEUE_COMMAND_TIMEOUT).and_then(|mut s| {
                tubes
                    .iter()
                    .try_fold(0, |n, t| Ok(n + s.kick_delayed(t, KICK_LIMIT)?))
            });
            (addr, n)
        })
        .collect()
}
