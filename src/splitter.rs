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

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::queue::{self, JobBody, QueueError, Server};
use crate::store::campaigns::{self, Confirm, Intent};
use crate::store::{
    deliveries, installation, recipients, Campaign, CampaignState, Conn, RecipientStatus,
    StoreError,
};
use crate::tokens::Identity;

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
}

#[derive(Debug, Clone, PartialEq)]
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
    let mut campaign = campaigns::find(conn, name)?;
    let mut report = Report {
        jobs: 0,
        recipients: 0,
        skipped: 0,
        already_done: false,
        recovered: false,
        elapsed: Duration::ZERO,
    };
    match campaign.state {
        CampaignState::Cancelled => return Err(EnqueueError::Cancelled(campaign.name)),
        CampaignState::Queued => {
            report.already_done = true;
            return Ok(report);
        }
        CampaignState::Draft => campaigns::start_enqueue(conn, campaign.id)?,
        CampaignState::Enqueuing => {}
    }
    let identity = Identity::from(&installation::load(conn)?);
    let mut fanout = Fanout::connect(&opts.servers, &opts.tube, identity)?;
    // One small transaction per job: on PostgreSQL each would otherwise wait
    // for its own WAL flush (~0.3 ms here, 3 s of a million-recipient
    // enqueue). If the database server (not this process) crashed and lost
    // the last steps, a re-run would put those jobs again; the ledger's claim
    // still sends each recipient once, so nobody is mailed twice or skipped.
    conn.defer_commit_flush()?;
    if campaign.pending_upto.is_some() {
        report.recovered = resolve_in_doubt(conn, &campaign, &mut fanout, &opts.tube)?;
        campaign = campaigns::find(conn, &campaign.id.to_string())?;
    }

    let total = recipients::list_size(conn, campaign.list_id)?;
    let bar = progress_bar(opts.progress, total as u64);
    let priority = queue::priority(campaign.priority);
    let mut scan_pos = campaign.enqueue_cursor;
    let mut batch: Vec<i64> = Vec::with_capacity(opts.batch_size);
    let mut skipped: Vec<i64> = Vec::new();
    // The put whose cursor advance rides on the next store transaction.
    let mut unconfirmed: Option<Confirm> = None;

    loop {
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
                    &mut fanout,
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
            &mut fanout,
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
    campaigns::enqueue_step(conn, campaign.id, Some(&last), None)?;
    campaigns::finish_enqueue(conn, campaign.id)?;
    bar.finish_and_clear();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Record the intent, put one job, and remember what to confirm.
#[allow(clippy::too_many_arguments)]
fn put_batch(
    conn: &mut Conn,
    campaign: &Campaign,
    fanout: &mut Fanout,
    batch: &mut Vec<i64>,
    skipped: &mut Vec<i64>,
    unconfirmed: &mut Option<Confirm>,
    priority: u32,
) -> Result<(), EnqueueError> {
    let upto = *batch.last().unwrap_or(&0);
    let slot = fanout.next % fanout.servers.len();
    fanout.next += 1;
    let (server, newest) = &mut fanout.servers[slot];
    let intent = Intent {
        upto,
        server: server.addr.to_string(),
        after_job: *newest as i64,
    };
    campaigns::enqueue_step(conn, campaign.id, unconfirmed.as_ref(), Some(&intent))?;
    let body = JobBody::new(campaign.id, std::mem::take(batch));
    let id = server.put(&body.encode(&fanout.identity), priority)?;
    *newest = id;
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
    fanout: &mut Fanout,
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
    let server = match fanout.servers.iter_mut().find(|(s, _)| s.addr == addr) {
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
            if let Ok(job) = JobBody::decode(&body, &fanout.identity) {
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
        campaigns::enqueue_step(conn, campaign.id, None, None)?;
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
    campaigns::enqueue_step(conn, campaign.id, Some(&confirm), None)?;
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
