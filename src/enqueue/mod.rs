//! `mailsplit enqueue`: read a campaign's list in keyset pages and put one
//! job per batch of active recipients, spread round-robin over the
//! beanstalkd servers.
//!
//! Crash safety: the list is read a page at a time, and each page's jobs
//! are a *window*. Before its first put the store records an *intent* (the
//! page's last recipient id, and each server with its newest job id); the
//! next step's transaction advances the cursor past the window's jobs. If
//! the process dies in between, the next run looks for the window's
//! recipients in the jobs above those ids (ids only grow) and in the ledger,
//! and puts only those in neither. So a re-run never enqueues a recipient
//! twice and never skips one, at one database round trip per page instead
//! of per job.
//!
//! One run at a time: a run takes the campaign with a lease in the database
//! (`campaigns.enqueue_owner`, `enqueue_lease_until`), renewed by every step
//! and given up at the end. A second run waits for it (saying so) and then
//! finds the campaign enqueued; a run killed with -9 gives the campaign up
//! when its lease runs out (at once to a run on the same host, which sees
//! its process gone), and the next run continues from the cursor.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::queue::{self, JobBody, QueueError, Server};
use crate::send_at;
use crate::store::campaigns::{self, Confirm, Intent};
use crate::store::{
    installation, now_ms, recipients, Campaign, CampaignState, Conn, RecipientStatus, StoreError,
};
use crate::tokens::Identity;

mod doubt;
mod lease;
pub mod requeue;
mod window;

use doubt::resolve_in_doubt;
use lease::{wait_for_lease, RunName};
use window::{Batcher, Member};

/// Recipients read per database round trip.
pub const PAGE_SIZE: i64 = 10_000;

/// The page in force: [`PAGE_SIZE`], unless the hidden
/// `MAILSPLIT_PAGE_SIZE` (a multiple of 100, from 100 up to [`PAGE_SIZE`]:
/// it only shrinks the page, so it cannot grow what a run holds in
/// memory) sets another.
/// Why: the tests that kill an enqueue in different windows need several
/// pages, and with 10,000 to a page that meant sending 50,000 messages
/// where 5,000 prove the same; a page is only how much is read at once,
/// never what a job holds.
pub fn page_size() -> i64 {
    static PAGE: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
        std::env::var("MAILSPLIT_PAGE_SIZE")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|&n| (100..=PAGE_SIZE).contains(&n) && n % 100 == 0)
            .unwrap_or(PAGE_SIZE)
    });
    *PAGE
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("campaign {0:?} is cancelled; nothing to enqueue")]
    Cancelled(String),
    #[error("the last job of an interrupted run may be on beanstalkd {0}, which is not reachable: start it (or add it to --beanstalkd) and run enqueue again")]
    InDoubt(String),
    #[error("campaign {campaign:?} is still being enqueued by another run ({owner}) after waiting {waited:?}: let that run finish and run `mailsplit enqueue {campaign}` again (it will find the campaign enqueued, or continue where a dead run stopped: a killed run gives the campaign up within {lease_secs} s), or wait longer with --wait")]
    Busy {
        campaign: String,
        owner: String,
        waited: Duration,
        lease_secs: i64,
    },
}

impl EnqueueError {
    pub fn is_usage(&self) -> bool {
        match self {
            EnqueueError::Store(e) => e.is_usage(),
            EnqueueError::Cancelled(_) => true,
            _ => false,
        }
    }
}

pub struct Options {
    pub batch_size: usize,
    pub servers: Vec<SocketAddr>,
    pub tube: String,
    /// Draw a progress bar (only when stderr is a terminal).
    pub progress: bool,
    /// How long to wait for another run of the same campaign to finish.
    pub wait: Duration,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Enqueued {
    /// Jobs put by this run.
    pub jobs: u64,
    /// Recipients put into those jobs.
    pub recipients: u64,
    /// Recipients recorded as skipped (not active) by this run.
    pub skipped: u64,
    /// The campaign had been fully enqueued before this run.
    pub already_done: bool,
    /// A job from an interrupted run was found already in the queue.
    pub recovered: bool,
    pub elapsed: Duration,
}

/// Connections to every server, each with its newest job id, and the
/// database identity every job is signed for.
struct Fanout {
    servers: Vec<(Server, u64)>,
    next: usize,
    identity: Identity,
    /// The campaign's start time: its jobs are put delayed until then
    /// (at most [`send_at::MAX_WAIT`]), so no worker meets them early.
    send_at: Option<i64>,
}

impl Fanout {
    fn connect(
        addrs: &[SocketAddr],
        tube: &str,
        identity: Identity,
        send_at: Option<i64>,
    ) -> Result<Fanout, QueueError> {
        let mut servers = Vec::with_capacity(addrs.len());
        for &addr in addrs {
            let mut server = Server::connect(addr)?;
            let newest = server.newest_job_id(tube)?;
            servers.push((server, newest));
        }
        Ok(Fanout {
            servers,
            next: 0,
            identity,
            send_at,
        })
    }
    /// An intent for the members up to `upto`: every server with its
    /// newest job id now.
    fn intent(&self, upto: i64) -> Intent {
        Intent {
            upto,
            servers: self
                .servers
                .iter()
                .map(|(server, newest)| (server.addr.to_string(), *newest))
                .collect(),
        }
    }

    /// Put one signed job on the next server in turn.
    fn put(&mut self, campaign: i64, batch: Vec<i64>, priority: u32) -> Result<(), QueueError> {
        let slot = self.next % self.servers.len();
        self.next += 1;
        let encoded = JobBody::new(campaign, batch).encode(&self.identity);
        let (server, newest) = &mut self.servers[slot];
        *newest = match send_at::wait(self.send_at, now_ms()) {
            Some(delay) => server.put_delayed(&encoded, priority, delay)?,
            None => server.put(&encoded, priority)?,
        };
        Ok(())
    }
}

pub fn enqueue(conn: &mut Conn, name: &str, opts: &Options) -> Result<Enqueued, EnqueueError> {
    let started = Instant::now();
    let campaign = campaigns::find(conn, name)?;
    // Nothing to wait for when there is nothing to do.
    match campaign.state {
        CampaignState::Cancelled => return Err(EnqueueError::Cancelled(campaign.name)),
        CampaignState::Queued => {
            return Ok(Enqueued {
                already_done: true,
                ..Enqueued::default()
            })
        }
        CampaignState::Draft | CampaignState::Enqueuing => {}
    }
    let owner = RunName::this_run().to_string();
    wait_for_lease(conn, &campaign, &owner, opts.wait)?;
    let result = enqueue_leased(conn, campaign.id, &owner, opts, started);
    // Give the campaign up at once, also after a failure, so that a re-run
    // need not wait for the lease to run out.
    if let Err(e) = campaigns::release_enqueue_lease(conn, campaign.id, &owner) {
        tracing::warn!(error = %e, "cannot give up the enqueue lease; it runs out by itself");
    }
    result
}

/// A campaign by its id (never by a name that happens to be digits).
fn by_id(conn: &mut Conn, id: i64) -> Result<Campaign, StoreError> {
    campaigns::get(conn, id)?.ok_or_else(|| StoreError::UnknownCampaign(id.to_string()))
}

/// The run proper, holding the campaign's lease as `owner`.
fn enqueue_leased(
    conn: &mut Conn,
    campaign_id: i64,
    owner: &str,
    opts: &Options,
    started: Instant,
) -> Result<Enqueued, EnqueueError> {
    // Read again under the lease: a run we waited for may have finished it.
    let mut campaign = by_id(conn, campaign_id)?;
    let mut report = Enqueued::default();
    let total = recipients::list_size(conn, campaign.list_id)?;
    match campaign.state {
        CampaignState::Cancelled => return Err(EnqueueError::Cancelled(campaign.name)),
        CampaignState::Queued => {
            report.already_done = true;
            return Ok(report);
        }
        CampaignState::Draft => campaigns::start_enqueue(conn, campaign.id, total)?,
        CampaignState::Enqueuing => {}
    }
    let identity = Identity::from(&installation::load(conn)?);
    let mut run = Run {
        fanout: Fanout::connect(&opts.servers, &opts.tube, identity, campaign.send_at)?,
        owner: owner.to_string(),
        priority: queue::priority(campaign.priority),
    };
    // One small transaction per window: on PostgreSQL each would otherwise
    // wait for its own WAL flush. If the database server (not this process)
    // crashed and lost the last steps, a re-run would put those jobs again;
    // the ledger's claim still sends each recipient once, so nobody is
    // mailed twice or skipped.
    conn.defer_commit_flush()?;
    if campaign.pending_upto.is_some() {
        resolve_in_doubt(conn, &campaign, &mut run, opts, &mut report)?;
        campaign = by_id(conn, campaign.id)?;
    }

    let bar = progress_bar(opts.progress, total as u64);
    let done = walk(conn, &campaign, &mut run, opts, &bar, &mut report)?;
    run.step(conn, &campaign, Some(&done), None)?;
    campaigns::finish_enqueue(conn, campaign.id, owner)?;
    bar.finish_and_clear();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Walk the list from the campaign's cursor: one window per page (one
/// store step that confirms the last window and records this one's
/// intent, then its jobs, put back to back), and the remainder as a
/// shorter last job. Returns what the final step must confirm.
fn walk(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    opts: &Options,
    bar: &ProgressBar,
    report: &mut Enqueued,
) -> Result<Confirm, EnqueueError> {
    let mut batcher = Batcher::new(opts.batch_size, campaign.enqueue_cursor);
    // What the next step confirms: the last window's puts and the members
    // they cover, up to its cursor.
    let mut done = Confirm {
        cursor: campaign.enqueue_cursor,
        ..Confirm::default()
    };
    loop {
        let page = recipients::member_page(conn, campaign.list_id, batcher.pos(), page_size())?;
        let Some(&(last, _)) = page.last() else { break };
        let read = page.len() as u64;
        let mut window: Vec<Vec<i64>> = Vec::new();
        for (rid, status) in page {
            let member = if status == RecipientStatus::Active {
                Member::Active
            } else {
                report.skipped += 1;
                Member::Skipped
            };
            window.extend(batcher.push(rid, member));
        }
        let this = Confirm {
            cursor: batcher.covered(),
            enqueued: window.iter().map(|b| b.len() as i64).sum(),
            jobs: window.len() as i64,
            skipped: batcher.take_covered_skips(),
        };
        report.jobs += this.jobs as u64;
        report.recipients += this.enqueued as u64;
        // Pages that put nothing (all skipped) still step, renewing the
        // lease and recording their skips.
        run.put_window(conn, campaign, &done, last, window)?;
        done = this;
        bar.inc(read);
    }
    let rest = batcher.finish();
    if rest.is_empty() {
        return Ok(done);
    }
    let last = Confirm {
        cursor: batcher.covered(),
        enqueued: rest.len() as i64,
        jobs: 1,
        skipped: batcher.take_covered_skips(),
    };
    report.jobs += 1;
    report.recipients += rest.len() as u64;
    run.put_window(conn, campaign, &done, batcher.covered(), vec![rest])?;
    Ok(last)
}

/// One run's connections and its hold on the campaign.
struct Run {
    fanout: Fanout,
    /// This run's name in the lease.
    owner: String,
    /// The campaign's jobs' beanstalkd priority.
    priority: u32,
}

impl Run {
    /// One enqueue step under this run's lease (renewing it). A step that
    /// fails because another run took the campaign over says so.
    fn step(
        &self,
        conn: &mut Conn,
        campaign: &Campaign,
        confirm: Option<&Confirm>,
        intent: Option<&Intent>,
    ) -> Result<(), EnqueueError> {
        campaigns::enqueue_step(conn, campaign.id, &self.owner, confirm, intent).map_err(|e| {
            match campaigns::holds_enqueue_lease(conn, campaign.id, &self.owner) {
                Ok(false) => StoreError::LeaseLost(campaign.name.clone()).into(),
                _ => e.into(),
            }
        })
    }

    /// Confirm `done`, record the intent of a window of jobs covering the
    /// members up to `upto`, then put them. With no jobs, just the confirm.
    fn put_window(
        &mut self,
        conn: &mut Conn,
        campaign: &Campaign,
        done: &Confirm,
        upto: i64,
        window: Vec<Vec<i64>>,
    ) -> Result<(), EnqueueError> {
        if window.is_empty() {
            return self.step(conn, campaign, Some(done), None);
        }
        let intent = self.fanout.intent(upto);
        self.step(conn, campaign, Some(done), Some(&intent))?;
        for batch in window {
            self.fanout.put(campaign.id, batch, self.priority)?;
        }
        Ok(())
    }
}

fn progress_bar(enabled: bool, total: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} enqueue [{bar:40}] {pos}/{len} recipients ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
