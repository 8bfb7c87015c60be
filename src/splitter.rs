//! `mailsplit enqueue`: read a campaign's list in keyset pages and put one
//! job per batch of active recipients, spread round-robin over the
//! beanstalkd servers.
//!
//! Crash safety: before each put the store records an *intent* (the batch's
//! last recipient id, the server, and that server's newest job id); after the
//! put, the next step's transaction advances the cursor past the batch. If
//! the process dies in between, the next run looks for the job on that server
//! by id (ids only grow) and in the ledger, and puts it again only if it is in
//! neither. So a re-run never enqueues a recipient twice and never skips one.
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
use crate::store::campaigns::{self, Confirm, Intent, LeaseHolder, ENQUEUE_LEASE_RENEW};
use crate::store::{
    deliveries, installation, recipients, Campaign, CampaignState, Conn, RecipientStatus,
    StoreError,
};
use crate::tokens::Identity;

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

/// Recipients read per database round trip.
pub const PAGE_SIZE: i64 = 10_000;
/// The furthest an in-doubt search walks job ids on one server.
const MAX_PEEK_SCAN: u64 = 1_000_000;

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
pub struct Report {
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
}

impl Fanout {
    fn connect(addrs: &[SocketAddr], tube: &str, identity: Identity) -> Result<Fanout, QueueError> {
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
        })
    }
}

pub fn enqueue(conn: &mut Conn, name: &str, opts: &Options) -> Result<Report, EnqueueError> {
    let started = Instant::now();
    let campaign = campaigns::find(conn, name)?;
    // Nothing to wait for when there is nothing to do.
    match campaign.state {
        CampaignState::Cancelled => return Err(EnqueueError::Cancelled(campaign.name)),
        CampaignState::Queued => {
            return Ok(Report {
                already_done: true,
                ..Report::default()
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

/// How a run names itself in the lease (and in another run's message):
/// `pid 4242 on host-a, run 3f9c01d2`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RunName {
    pid: u32,
    host: String,
    run: u32,
}

impl RunName {
    fn this_run() -> RunName {
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
fn wait_for_lease(
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

/// The run proper, holding the campaign's lease as `owner`.
fn enqueue_leased(
    conn: &mut Conn,
    campaign_id: i64,
    owner: &str,
    opts: &Options,
    started: Instant,
) -> Result<Report, EnqueueError> {
    // Read again under the lease: a run we waited for may have finished it.
    let mut campaign = campaigns::find(conn, &campaign_id.to_string())?;
    let mut report = Report::default();
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
        fanout: Fanout::connect(&opts.servers, &opts.tube, identity)?,
        owner: owner.to_string(),
        renewed: Instant::now(),
    };
    // One small transaction per job: on PostgreSQL each would otherwise wait
    // for its own WAL flush (~0.3 ms here, 3 s of a million-recipient
    // enqueue). If the database server (not this process) crashed and lost
    // the last steps, a re-run would put those jobs again; the ledger's claim
    // still sends each recipient once, so nobody is mailed twice or skipped.
    conn.defer_commit_flush()?;
    if campaign.pending_upto.is_some() {
        report.recovered = resolve_in_doubt(conn, &campaign, &mut run, &opts.tube)?;
        campaign = campaigns::find(conn, &campaign.id.to_string())?;
    }

    let bar = progress_bar(opts.progress, total as u64);
    let priority = queue::priority(campaign.priority);
    let mut scan_pos = campaign.enqueue_cursor;
    let mut batch: Vec<i64> = Vec::with_capacity(opts.batch_size);
    let mut skipped: Vec<i64> = Vec::new();
    // The put whose cursor advance rides on the next store transaction.
    let mut unconfirmed: Option<Confirm> = None;

    loop {
        // Pages of recipients that are all skipped put nothing, so nothing
        // renews the lease on the way: renew it here.
        run.renew_if_due(conn, &campaign)?;
        let page = recipients::member_page(conn, campaign.list_id, scan_pos, PAGE_SIZE)?;
        let Some(&(last, _)) = page.last() else { break };
        let read = page.len() as u64;
        for (rid, status) in page {
            if status == RecipientStatus::Active {
                batch.push(rid);
            } else {
                skipped.push(rid);
                report.skipped += 1;
            }
            if batch.len() == opts.batch_size {
                put_batch(
                    conn,
                    &campaign,
                    &mut run,
                    &mut batch,
                    &mut skipped,
                    &mut unconfirmed,
                    priority,
                )?;
                report.jobs += 1;
                report.recipients += opts.batch_size as u64;
            }
        }
        bar.inc(read);
        scan_pos = last;
    }
    if !batch.is_empty() {
        report.recipients += batch.len() as u64;
        report.jobs += 1;
        put_batch(
            conn,
            &campaign,
            &mut run,
            &mut batch,
            &mut skipped,
            &mut unconfirmed,
            priority,
        )?;
    }
    // Confirm the last put together with any trailing skipped recipients.
    let mut last = unconfirmed.take().unwrap_or_default();
    last.cursor = last.cursor.max(scan_pos);
    last.skipped.append(&mut skipped);
    run.step(conn, &campaign, Some(&last), None)?;
    campaigns::finish_enqueue(conn, campaign.id, owner)?;
    bar.finish_and_clear();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// One run's connections and its hold on the campaign.
struct Run {
    fanout: Fanout,
    /// This run's name in the lease.
    owner: String,
    /// When the lease was last renewed.
    renewed: Instant,
}

impl Run {
    /// One enqueue step under this run's lease (renewing it). A step that
    /// fails because another run took the campaign over says so.
    fn step(
        &mut self,
        conn: &mut Conn,
        campaign: &Campaign,
        confirm: Option<&Confirm>,
        intent: Option<&Intent>,
    ) -> Result<(), EnqueueError> {
        match campaigns::enqueue_step(conn, campaign.id, &self.owner, confirm, intent) {
            Ok(()) => {
                self.renewed = Instant::now();
                Ok(())
            }
            Err(e) => match campaigns::holds_enqueue_lease(conn, campaign.id, &self.owner) {
                Ok(false) => Err(StoreError::LeaseLost(campaign.name.clone()).into()),
                _ => Err(e.into()),
            },
        }
    }

    fn renew_if_due(&mut self, conn: &mut Conn, campaign: &Campaign) -> Result<(), EnqueueError> {
        if self.renewed.elapsed() >= ENQUEUE_LEASE_RENEW {
            campaigns::renew_enqueue_lease(conn, campaign.id, &self.owner).map_err(
                |e| match e {
                    StoreError::LeaseLost(_) => StoreError::LeaseLost(campaign.name.clone()),
                    other => other,
                },
            )?;
            self.renewed = Instant::now();
        }
        Ok(())
    }
}

/// Record the intent, put one job, and remember what to confirm.
fn put_batch(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    batch: &mut Vec<i64>,
    skipped: &mut Vec<i64>,
    unconfirmed: &mut Option<Confirm>,
    priority: u32,
) -> Result<(), EnqueueError> {
    let upto = *batch.last().unwrap_or(&0);
    let slot = run.fanout.next % run.fanout.servers.len();
    run.fanout.next += 1;
    let intent = Intent {
        upto,
        server: run.fanout.servers[slot].0.addr.to_string(),
        after_job: run.fanout.servers[slot].1 as i64,
    };
    run.step(conn, campaign, unconfirmed.as_ref(), Some(&intent))?;
    let body = JobBody::new(campaign.id, std::mem::take(batch));
    let encoded = body.encode(&run.fanout.identity);
    let (server, newest) = &mut run.fanout.servers[slot];
    *newest = server.put(&encoded, priority)?;
    *unconfirmed = Some(Confirm {
        cursor: upto,
        enqueued: body.recipients.len() as i64,
        jobs: 1,
        skipped: std::mem::take(skipped),
    });
    batch.reserve(body.recipients.len());
    Ok(())
}

/// A previous run died between recording an intent and confirming its put.
/// Find out whether the job got in; confirm it if so, drop the intent if
/// not. Returns whether the job was found.
fn resolve_in_doubt(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    tube: &str,
) -> Result<bool, EnqueueError> {
    let (Some(upto), Some(server_addr), Some(after_job)) = (
        campaign.pending_upto,
        campaign.pending_server.clone(),
        campaign.pending_after_job,
    ) else {
        return Ok(false);
    };
    let addr: SocketAddr = server_addr
        .parse()
        .map_err(|_| EnqueueError::InDoubt(server_addr.clone()))?;
    let mut own;
    let server = match run.fanout.servers.iter_mut().find(|(s, _)| s.addr == addr) {
        Some((s, _)) => s,
        None => {
            own = Server::connect(addr).map_err(|_| EnqueueError::InDoubt(server_addr.clone()))?;
            &mut own
        }
    };
    let newest = server.newest_job_id(tube)?;
    let after_job = after_job.max(0) as u64;
    let mut found = false;
    for id in (after_job + 1)..newest.min(after_job + MAX_PEEK_SCAN) {
        if let Some(body) = server.peek(id)? {
            if let Ok(job) = JobBody::decode(&body, &run.fanout.identity) {
                if job.campaign == campaign.id && job.recipients.last() == Some(&upto) {
                    found = true;
                    break;
                }
            }
        }
    }
    // Already taken and finished by a worker: the ledger has its recipients.
    found = found || deliveries::any_in_range(conn, campaign.id, campaign.enqueue_cursor, upto)?;
    if !found {
        tracing::info!(upto, server = %addr, "interrupted job never reached beanstalkd; putting it again");
        run.step(conn, campaign, None, None)?;
        return Ok(false);
    }
    // Rebuild what the interrupted run would have confirmed.
    let mut confirm = Confirm {
        cursor: upto,
        enqueued: 0,
        jobs: 1,
        skipped: Vec::new(),
    };
    let mut pos = campaign.enqueue_cursor;
    'pages: loop {
        let page = recipients::member_page(conn, campaign.list_id, pos, PAGE_SIZE)?;
        if page.is_empty() {
            break;
        }
        for (rid, status) in page {
            if rid > upto {
                break 'pages;
            }
            pos = rid;
            if status == RecipientStatus::Active {
                confirm.enqueued += 1;
            } else {
                confirm.skipped.push(rid);
            }
        }
    }
    tracing::info!(upto, server = %addr, "interrupted job found in the queue; not putting it again");
    run.step(conn, campaign, Some(&confirm), None)?;
    Ok(true)
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
