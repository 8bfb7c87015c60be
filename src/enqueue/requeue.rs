//! `mailsplit requeue`: put jobs again for every recipient of a campaign
//! that has no final outcome in the ledger — what brings a campaign back
//! after beanstalkd lost its jobs (restarted without a binlog, tube
//! emptied by hand), where it would otherwise stay "sending" forever.
//! `--failed` first makes failed deliveries to still-active recipients
//! claimable again (after a relay was fixed); bounced and unsubscribed
//! recipients are never retried.
//!
//! Safe to run twice and while workers run: a recipient already sent,
//! failed or skipped is left out, and one that is in two jobs (an old one
//! still queued and a requeued one) is claimed by one of them only — the
//! ledger's claim keeps exactly-once. Counters move only where the ledger
//! does (`--failed` takes the reopened rows out of `failed`).

use std::net::SocketAddr;

use crate::enqueue::page_size;
use crate::queue::{self, JobBody, QueueError, Server};
use crate::store::{
    campaigns, deliveries, installation, recipients, CampaignState, Conn, StoreError,
};
use crate::tokens::Identity;

#[derive(Debug, thiserror::Error)]
pub enum RequeueError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("campaign {0:?} is cancelled; nothing to requeue")]
    Cancelled(String),
    #[error("campaign {0:?} is not fully enqueued yet: run `mailsplit enqueue {0}` (it continues where it stopped)")]
    NotEnqueued(String),
}

impl RequeueError {
    pub fn is_usage(&self) -> bool {
        match self {
            RequeueError::Store(e) => e.is_usage(),
            RequeueError::Cancelled(_) | RequeueError::NotEnqueued(_) => true,
            RequeueError::Queue(_) => false,
        }
    }
}

pub struct Options {
    pub batch_size: usize,
    pub servers: Vec<SocketAddr>,
    pub tube: String,
    /// Also retry failed deliveries to recipients still active.
    pub failed: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requeued {
    /// Failed deliveries made claimable again (`--failed`).
    pub reopened: i64,
    /// Recipients put into jobs.
    pub recipients: u64,
    pub jobs: u64,
}

pub fn requeue(conn: &mut Conn, name: &str, opts: &Options) -> Result<Requeued, RequeueError> {
    let campaign = campaigns::find(conn, name)?;
    match campaign.state {
        CampaignState::Cancelled => return Err(RequeueError::Cancelled(campaign.name)),
        CampaignState::Draft | CampaignState::Enqueuing => {
            return Err(RequeueError::NotEnqueued(campaign.name))
        }
        CampaignState::Queued => {}
    }
    let mut out = Putter {
        servers: connect_all(opts)?,
        identity: Identity::from(&installation::load(conn)?),
        campaign: &campaign,
        priority: queue::priority(campaign.priority),
    };
    let mut report = Requeued::default();
    if opts.failed {
        report.reopened = deliveries::reopen_failed(conn, campaign.id)?;
    }
    campaigns::include_members(conn, &campaign)?;
    let mut batch: Vec<i64> = Vec::with_capacity(opts.batch_size);
    // Keyset pages of the list up to where enqueue went; per page, one
    // query for the finished ones. Memory: one page and one batch.
    let mut after = 0;
    while after < campaign.enqueue_cursor {
        let page: Vec<i64> = recipients::member_page(conn, campaign.list_id, after, page_size())?
            .into_iter()
            .map(|(rid, _)| rid)
            .take_while(|&rid| rid <= campaign.enqueue_cursor)
            .collect();
        let Some(&last) = page.last() else { break };
        let finished = deliveries::finished_among(conn, campaign.id, &page)?;
        let finished: std::collections::HashSet<i64> = finished.into_iter().collect();
        for rid in page.into_iter().filter(|r| !finished.contains(r)) {
            batch.push(rid);
            if batch.len() == opts.batch_size {
                out.put(&mut batch, &mut report)?;
            }
        }
        after = last;
    }
    if !batch.is_empty() {
        out.put(&mut batch, &mut report)?;
    }
    Ok(report)
}

/// A connection to every server, each on the tube.
fn connect_all(opts: &Options) -> Result<Vec<Server>, RequeueError> {
    let mut servers = Vec::with_capacity(opts.servers.len());
    for &addr in &opts.servers {
        let mut server = Server::connect(addr)?;
        server.use_tube(&opts.tube)?;
        servers.push(server);
    }
    Ok(servers)
}

/// Puts a campaign's jobs round-robin over the servers.
struct Putter<'a> {
    servers: Vec<Server>,
    identity: Identity,
    campaign: &'a crate::store::Campaign,
    priority: u32,
}

impl Putter<'_> {
    /// Put `batch` (emptied) as one job, and count it in `report`.
    fn put(&mut self, batch: &mut Vec<i64>, report: &mut Requeued) -> Result<(), RequeueError> {
        let slot = report.jobs as usize % self.servers.len();
        let body = JobBody::new(self.campaign.id, std::mem::take(batch));
        let encoded = body.encode(&self.identity);
        // A campaign not started yet: its jobs wait until then, like
        // `enqueue`'s.
        match crate::send_at::wait(self.campaign.send_at, crate::store::now_ms()) {
            Some(delay) => self.servers[slot].put_delayed(&encoded, self.priority, delay)?,
            None => self.servers[slot].put(&encoded, self.priority)?,
        };
        report.jobs += 1;
        report.recipients += body.recipients.len() as u64;
        Ok(())
    }
}
