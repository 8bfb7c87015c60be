//! The webhook outbox: one row per (webhook, event), written in the
//! transaction of the fact it reports (an outcome in the ledger, a bounce,
//! an unsubscribe, a campaign seen done), so a receiver learns of every
//! fact that committed and of none that rolled back. Rows are written only
//! for the webhooks that want their kind: each connection keeps a copy of
//! who wants what ([`Subscribers`]), read again every
//! [`SUBSCRIBERS_TTL`], so an event kind nobody wants costs no write and no
//! query on the workers' hot path.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use diesel::prelude::*;

use super::schema::{campaign_counters as cc, campaigns, webhook_outbox as o, webhooks as w};
use super::{on, Conn, Result};

text_enum! {
    /// What a webhook can be told about.
    pub enum EventKind ("webhook event") {
        /// The relay accepted a message (one per recipient: high volume).
        Sent = "sent",
        /// A message failed for good.
        Failed = "failed",
        /// A sent message bounced (at send time or by a later report).
        Bounced = "bounced",
        /// A recipient reported a message as spam.
        Complained = "complained",
        /// A recipient unsubscribed by the campaign's one-click link.
        Unsubscribed = "unsubscribed",
        Opened = "opened",
        Clicked = "clicked",
        /// Every recipient of the campaign has an outcome.
        CampaignFinished = "campaign.finished",
        /// The campaign paused itself (failures or complaints over its
        /// limit; `status` says why).
        CampaignPaused = "campaign.paused",
    }
}

/// How long a connection trusts its copy of who wants what: a webhook
/// added (or removed) is heeded by every process within this time.
pub const SUBSCRIBERS_TTL: Duration = Duration::from_secs(3);

/// Rows per INSERT (6 bound values each, well under SQLite's limit).
const INSERT_CHUNK: usize = 1_000;

/// One connection's copy of the webhooks that want each event kind.
#[derive(Debug, Default)]
pub struct Subscribers {
    fetched: Option<Instant>,
    by_kind: BTreeMap<EventKind, Vec<i64>>,
}

/// One fact to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub kind: EventKind,
    pub campaign_id: Option<i64>,
    pub recipient_id: Option<i64>,
    /// When it happened (ms).
    pub at: i64,
    /// A click's link: (content version, link number).
    pub link: Option<(i64, i64)>,
    /// A click's URL when the template wrote the link (it has no number).
    pub link_url: Option<String>,
}

/// The webhooks that want `kind`, from the connection's copy (read again
/// when older than [`SUBSCRIBERS_TTL`]).
pub fn subscribers(conn: &mut Conn, kind: EventKind) -> Result<Vec<i64>> {
    let fresh = conn
        .subscribers
        .fetched
        .is_some_and(|at| at.elapsed() < SUBSCRIBERS_TTL);
    if !fresh {
        let rows: Vec<(i64, String)> = on!(conn, |c| w::table.select((w::id, w::events)).load(c))?;
        let mut by_kind: BTreeMap<EventKind, Vec<i64>> = BTreeMap::new();
        for (id, events) in rows {
            for kind in parse_kinds(&events) {
                by_kind.entry(kind).or_default().push(id);
            }
        }
        conn.subscribers = Subscribers {
            fetched: Some(Instant::now()),
            by_kind,
        };
    }
    Ok(conn
        .subscribers
        .by_kind
        .get(&kind)
        .cloned()
        .unwrap_or_default())
}

/// Forget the connection's copy (after adding or removing a webhook).
pub fn forget_subscribers(conn: &mut Conn) {
    conn.subscribers = Subscribers::default();
}

/// The kinds of a stored `events` column; unknown names (a newer
/// mailsplit's) are left out.
pub fn parse_kinds(events: &str) -> Vec<EventKind> {
    events
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect()
}

/// Write `events` into the outbox for every webhook that wants their kind,
/// in the caller's transaction; returns the rows written (0, and no write,
/// when nobody wants them). What the open and click writers call too.
pub fn record(conn: &mut Conn, events: &[NewEvent]) -> Result<usize> {
    let mut rows = Vec::new();
    let mut wanted: BTreeMap<EventKind, Vec<i64>> = BTreeMap::new();
    for e in events {
        let hooks = match wanted.entry(e.kind) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => v.insert(subscribers(conn, e.kind)?),
        };
        for &webhook in hooks.iter() {
            rows.push((
                o::webhook_id.eq(webhook),
                o::kind.eq(e.kind),
                o::campaign_id.eq(e.campaign_id),
                o::recipient_id.eq(e.recipient_id),
                o::at.eq(e.at),
                o::link_version.eq(e.link.map(|(v, _)| v)),
                o::link_n.eq(e.link.map(|(_, n)| n)),
                o::link_url.eq(e.link_url.as_deref()),
            ));
        }
    }
    let mut written = 0;
    for chunk in rows.chunks(INSERT_CHUNK) {
        written += on!(conn, |c| diesel::insert_into(o::table)
            .values(chunk)
            .execute(c))?;
    }
    Ok(written)
}

/// [`record`] for one kind and campaign and many recipients.
pub fn record_recipients(
    conn: &mut Conn,
    kind: EventKind,
    campaign_id: i64,
    recipient_ids: &[i64],
    at: i64,
) -> Result<usize> {
    if recipient_ids.is_empty() || subscribers(conn, kind)?.is_empty() {
        return Ok(0);
    }
    let events: Vec<NewEvent> = recipient_ids
        .iter()
        .map(|&rid| NewEvent {
            kind,
            campaign_id: Some(campaign_id),
            recipient_id: Some(rid),
            at,
            link: None,
            link_url: None,
        })
        .collect();
    record(conn, &events)
}

/// Mark the campaigns that are done (enqueued whole, every recipient with
/// an outcome) and not yet marked, and report each once as
/// `campaign.finished`, in one transaction. A read first, so that the
/// common answer (none) takes no write lock.
pub fn finish_campaigns(conn: &mut Conn, now: i64) -> Result<Vec<i64>> {
    let done = || {
        cc::table
            .filter(cc::finished_at.is_null())
            .filter(cc::recipients.le(cc::sent + cc::failed + cc::skipped))
            .filter(
                cc::campaign_id.eq_any(
                    campaigns::table
                        .filter(campaigns::state.eq(super::CampaignState::Queued))
                        .filter(campaigns::paused.eq(false))
                        .select(campaigns::id),
                ),
            )
    };
    let any: Vec<i64> = on!(conn, |c| done().select(cc::campaign_id).load(c))?;
    if any.is_empty() {
        return Ok(any);
    }
    conn.transaction(|conn| {
        let marked: Vec<i64> = on!(conn, |c| diesel::update(done())
            .set(cc::finished_at.eq(Some(now)))
            .returning(cc::campaign_id)
            .get_results(c))?;
        let events: Vec<NewEvent> = marked
            .iter()
            .map(|&id| NewEvent {
                kind: EventKind::CampaignFinished,
                campaign_id: Some(id),
                recipient_id: None,
                at: now,
                link: None,
                link_url: None,
            })
            .collect();
        record(conn, &events)?;
        Ok(marked)
    })
}

/// Outbox rows whose webhook is gone (written by a process whose copy of
/// the subscribers was a few seconds old when the webhook was removed).
pub fn delete_orphans(conn: &mut Conn) -> Result<usize> {
    Ok(on!(conn, |c| diesel::delete(o::table.filter(
        diesel::dsl::not(o::webhook_id.eq_any(w::table.select(w::id)))
    ))
    .execute(c))?)
}
