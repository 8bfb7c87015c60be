//! `mailsplit enqueue` and `mailsplit requeue`: recipients into jobs.

use std::io::IsTerminal;
use std::time::Duration;

use crate::cli::args::Global;
use crate::cli::out::outln;
use crate::cli::resolve::queue_options;
use crate::enqueue::{self, requeue};

use super::{open_migrated, Result};

/// Put a campaign's recipients into beanstalkd.
pub fn enqueue(g: &Global, campaign: &str, batch_size: usize, wait: u64) -> Result {
    let (batch_size, servers) = queue_options(g, batch_size)?;
    let mut conn = open_migrated(g)?;
    let done = enqueue::enqueue(
        &mut conn,
        campaign,
        &enqueue::Options {
            batch_size,
            servers,
            tube: g.tube.clone(),
            progress: std::io::stderr().is_terminal(),
            wait: Duration::from_secs(wait),
        },
    )?;
    if done.already_done {
        outln!("campaign {campaign:?} is already fully enqueued; nothing to do")?;
    } else {
        let secs = done.elapsed.as_secs_f64().max(1e-6);
        outln!(
            "enqueued {} recipients in {} jobs ({} skipped as not active) in {:.2} s, {:.0} jobs/s{}",
            done.recipients,
            done.jobs,
            done.skipped,
            secs,
            done.jobs as f64 / secs,
            if done.recovered { "; found the interrupted run's last jobs already queued (see the log for how many were put again)" } else { "" }
        )?;
    }
    Ok(())
}

/// Put jobs again for every recipient without a final outcome.
pub fn requeue(g: &Global, campaign: &str, failed: bool, batch_size: usize) -> Result {
    let (batch_size, servers) = queue_options(g, batch_size)?;
    let mut conn = open_migrated(g)?;
    let done = requeue::requeue(
        &mut conn,
        campaign,
        &requeue::Options {
            batch_size,
            servers,
            tube: g.tube.clone(),
            failed,
        },
    )?;
    if failed {
        outln!(
            "{} failed deliveries to active recipients will be tried again",
            done.reopened
        )?;
    }
    outln!(
        "requeued {} recipients without a final outcome in {} jobs",
        done.recipients,
        done.jobs
    )?;
    Ok(())
}
