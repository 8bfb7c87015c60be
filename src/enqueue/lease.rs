//! One run at a time: how a run names itself in the campaign's enqueue
//! lease, and how it waits for (or takes over from) another run.

use std::time::{Duration, Instant};

use super::EnqueueError;
use crate::store::campaigns::{self, LeaseHolder};
use crate::store::{Campaign, Conn};

/// How a run names itself in the lease (and in another run's message):
/// `pid 4242 on host-a, run 3f9c01d2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunName {
    pid: u32,
    host: String,
    run: u32,
}

impl RunName {
    pub(super) fn this_run() -> RunName {
        RunName {
            pid: std::process::id(),
            host: crate::config::host_name(),
            run: rand::random(),
        }
    }

    fn parse(text: &str) -> Option<RunName> {
        let rest = text.strip_prefix("pid ")?;
        let (pid, rest) = rest.split_once(" on ")?;
        let (host, run) = rest.rsplit_once(", run ")?;
        Some(RunName {
            pid: pid.parse().ok()?,
            host: host.to_string(),
            run: u32::from_str_radix(run, 16).ok()?,
        })
    }

    /// A run on this machine whose process is gone (killed, crashed,
    /// Ctrl-C): its campaign need not wait for the lease to run out.
    fn is_dead_here(&self) -> bool {
        self.host == crate::config::host_name()
            && (self.pid == std::process::id()
                || !std::path::Path::new(&format!("/proc/{}", self.pid)).exists())
    }
}

impl std::fmt::Display for RunName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {}, run {:08x}", self.pid, self.host, self.run)
    }
}

/// Take the campaign's enqueue lease, waiting up to `wait` while another
/// live run holds it.
pub(super) fn wait_for_lease(
    conn: &mut Conn,
    campaign: &Campaign,
    owner: &str,
    wait: Duration,
) -> Result<(), EnqueueError> {
    let started = Instant::now();
    let mut said: Option<String> = None;
    loop {
        let Some(LeaseHolder {
            owner: holder,
            until,
        }) = campaigns::take_enqueue_lease(conn, campaign.id, owner)?
        else {
            if said.is_some() {
                tracing::info!(campaign = %campaign.name, waited = ?started.elapsed(), "the other run is done; going on");
            }
            return Ok(());
        };
        if RunName::parse(&holder).is_some_and(|run| run.is_dead_here())
            && campaigns::take_enqueue_lease_from(conn, campaign.id, owner, &holder)?
        {
            tracing::info!(campaign = %campaign.name, other = %holder, "the run that held the campaign is gone; going on where it stopped");
            return Ok(());
        }
        if started.elapsed() >= wait {
            return Err(EnqueueError::Busy {
                campaign: campaign.name.clone(),
                owner: holder,
                waited: started.elapsed(),
                lease_secs: campaigns::ENQUEUE_LEASE_MS / 1000,
            });
        }
        if said.as_deref() != Some(holder.as_str()) {
            tracing::warn!(
                campaign = %campaign.name,
                other = %holder,
                lease_left = ?Duration::from_millis((until - crate::store::now_ms()).max(0) as u64),
                "waiting: another `enqueue` run of this campaign is under way, and only one may run at a time (two would put recipients twice); it is given up when that run ends, or when its lease runs out if it died on another machine"
            );
            said = Some(holder);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_round_trip_and_tell_dead_local_runs() {
        let me = RunName::this_run();
        assert_eq!(RunName::parse(&me.to_string()), Some(me.clone()));
        assert!(!me.is_dead_here() || me.pid == std::process::id());
        let odd = RunName {
            host: "a, run b".into(),
            ..me.clone()
        };
        assert_eq!(RunName::parse(&odd.to_string()), Some(odd));
        // Our parent is alive; a pid beyond pid_max never is.
        let parent = RunName {
            pid: std::os::unix::process::parent_id(),
            ..me.clone()
        };
        assert!(!parent.is_dead_here());
        let gone = RunName {
            pid: 4_194_305,
            ..me.clone()
        };
        assert!(gone.is_dead_here());
        let elsewhere = RunName {
            host: format!("not-{}", me.host),
            ..gone
        };
        assert!(
            !elsewhere.is_dead_here(),
            "another machine's pids say nothing"
        );
        assert_eq!(RunName::parse("somebody"), None);
    }
}
