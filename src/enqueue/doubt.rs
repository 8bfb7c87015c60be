//! Recovery after a run died inside a window: find which of the window's
//! recipients are already in a job or in the ledger, and put the rest.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::window::{Batcher, Member};
use super::{page_size, EnqueueError, Enqueued, Options, Run};
use crate::queue::{JobBody, Server};
use crate::store::campaigns::{self, Confirm};
use crate::store::{deliveries, recipients, Campaign, Conn, RecipientStatus};

/// The furthest an in-doubt search walks job ids on one server.
const MAX_PEEK_SCAN: u64 = 1_000_000;

/// A previous run died inside a window: after recording its intent and
/// before confirming its puts. Every active member in the window is in one
/// of its jobs still on a server (found above the job id the intent
/// recorded), in the ledger (a worker already took the job), or never put.
/// Put the last kind in jobs of `batch_size` (a remainder of less than a
/// batch at the window's end is left to the run, as the killed run would
/// have carried it into its next page) and confirm the window. The jobs
/// put, and whether any of the window was found, go into `report`.
pub(super) fn resolve_in_doubt(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    opts: &Options,
    report: &mut Enqueued,
) -> Result<(), EnqueueError> {
    let Some(intent) = campaign.pending_intent()? else {
        return Ok(());
    };
    let (seen, in_queue) = seen_in_window(conn, campaign, run, opts, &intent)?;
    let in_ledger = seen.len() - in_queue;
    widen_intent(conn, campaign, run, &intent)?;

    let (found, put, put_jobs, confirm) =
        put_unseen(conn, campaign, run, opts, &seen, intent.upto)?;
    tracing::info!(
        window_upto = intent.upto,
        found_in_queue = in_queue,
        found_in_ledger = in_ledger,
        put_again = put,
        "interrupted run resolved: {found} recipients of its last window found in the queue or the ledger, {put} put again"
    );
    run.step(conn, campaign, Some(&confirm), None)?;
    report.recovered = found > 0;
    report.jobs += put_jobs as u64;
    report.recipients += put as u64;
    Ok(())
}

/// The window's recipients already in a job on a server (above the job
/// id the intent recorded) or in the ledger, and how many of them were
/// found in the queue.
fn seen_in_window(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    opts: &Options,
    intent: &campaigns::Intent,
) -> Result<(HashSet<i64>, usize), EnqueueError> {
    let after = campaign.enqueue_cursor;
    let window = (after + 1)..=intent.upto;
    let mut seen: HashSet<i64> = HashSet::new();
    for (server_addr, after_job) in &intent.servers {
        let queued = queued_in_window(
            run,
            campaign.id,
            server_addr,
            *after_job,
            &window,
            &opts.tube,
        )?;
        seen.extend(queued);
        // A long search (many other jobs put since) must not lose the lease.
        campaigns::renew_enqueue_lease(conn, campaign.id, &run.owner)?;
    }
    let in_queue = seen.len();
    seen.extend(deliveries::recipients_in_range(
        conn,
        campaign.id,
        after,
        intent.upto,
    )?);
    Ok((seen, in_queue))
}

/// The jobs put from here on must be found by a later recovery too: every
/// server of this run goes into the intent.
fn widen_intent(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    intent: &campaigns::Intent,
) -> Result<(), EnqueueError> {
    let mut wider = intent.clone();
    for (addr, newest) in run.fanout.intent(intent.upto).servers {
        if !wider.servers.iter().any(|(a, _)| *a == addr) {
            wider.servers.push((addr, newest));
        }
    }
    if wider != *intent {
        run.step(conn, campaign, None, Some(&wider))?;
    }
    Ok(())
}

/// Walk the window's members from the cursor to `upto`: those `seen` in
/// the queue or the ledger are counted, the other active ones put in jobs
/// of `--batch-size` (a remainder of less than a batch is left to the run,
/// unless found members follow it). Returns (found, put, jobs put, the
/// step that confirms the window).
fn put_unseen(
    conn: &mut Conn,
    campaign: &Campaign,
    run: &mut Run,
    opts: &Options,
    seen: &HashSet<i64>,
    upto: i64,
) -> Result<(i64, i64, i64, Confirm), EnqueueError> {
    let last_seen = seen
        .iter()
        .copied()
        .max()
        .unwrap_or(campaign.enqueue_cursor);
    let mut batcher = Batcher::new(opts.batch_size, campaign.enqueue_cursor);
    let (mut found, mut put, mut put_jobs) = (0i64, 0i64, 0i64);
    'pages: loop {
        let page = recipients::member_page(conn, campaign.list_id, batcher.pos(), page_size())?;
        if page.is_empty() {
            break;
        }
        for (rid, status) in page {
            if rid > upto {
                break 'pages;
            }
            let member = match status {
                RecipientStatus::Active if seen.contains(&rid) => Member::Found,
                RecipientStatus::Active => Member::Active,
                _ => Member::Skipped,
            };
            found += i64::from(member == Member::Found);
            if let Some(full) = batcher.push(rid, member) {
                put += full.len() as i64;
                put_jobs += 1;
                run.fanout.put(campaign.id, full, run.priority)?;
            }
        }
    }
    // A remainder with found members after it (the window was not put in
    // order: not from a run of ours) goes out now as a shorter job.
    if batcher
        .first_carried()
        .is_some_and(|first| first < last_seen)
    {
        let rest = batcher.finish();
        put += rest.len() as i64;
        put_jobs += 1;
        run.fanout.put(campaign.id, rest, run.priority)?;
    }
    let confirm = Confirm {
        cursor: batcher.covered(),
        enqueued: found + put,
        jobs: put_jobs + (found as u64).div_ceil(opts.batch_size as u64) as i64,
        skipped: batcher.take_covered_skips(),
    };
    Ok((found, put, put_jobs, confirm))
}

/// The window's recipients in jobs of `campaign` on `server_addr` above job
/// id `after_job`.
fn queued_in_window(
    run: &mut Run,
    campaign: i64,
    server_addr: &str,
    after_job: u64,
    window: &std::ops::RangeInclusive<i64>,
    tube: &str,
) -> Result<Vec<i64>, EnqueueError> {
    let in_doubt = || EnqueueError::InDoubt(server_addr.to_string());
    let addr: SocketAddr = server_addr.parse().map_err(|_| in_doubt())?;
    let mut own;
    let server = match run.fanout.servers.iter_mut().find(|(s, _)| s.addr == addr) {
        Some((s, _)) => s,
        None => {
            own = Server::connect(addr).map_err(|_| in_doubt())?;
            &mut own
        }
    };
    let newest = server.newest_job_id(tube)?;
    let mut queued = Vec::new();
    for id in (after_job + 1)..newest.min(after_job + MAX_PEEK_SCAN) {
        let Some(body) = server.peek(id)? else {
            continue;
        };
        if let Ok(job) = JobBody::decode(&body, &run.fanout.identity) {
            if job.campaign == campaign {
                queued.extend(job.recipients.into_iter().filter(|r| window.contains(r)));
            }
        }
    }
    Ok(queued)
}
