//! What recipients did with a campaign's messages: opens,
//! clicks and unsubscribes, per recipient (table `engagement`: first open,
//! first click, counts), per link (`campaign_links.clicks`) and per
//! campaign (`campaign_engagement`, changed in the same transaction as the
//! recipient's row and driven by its affected-row counts, so `status` is
//! O(1) and always equals a count over `engagement`).
//!
//! Every open and click is recorded by [`record_batch`] (through
//! `record_hit`) and nothing else: a writer of another fact about the hit
//! (an outbox row for a webhook) goes into the same transaction there,
//! using [`Recorded`].

use std::collections::HashMap;
use std::sync::Arc;

use diesel::prelude::*;

use super::schema::{
    campaign_engagement as ce, campaign_links as l, deliveries as d, engagement as e,
};
use super::{on, optouts, outbox, Conn, DeliveryState, RecipientStatus, Result};

/// An open within this long after the message was sent is a machine's
/// (a mail proxy fetching images on arrival, as Apple Mail Privacy
/// Protection does), not a reader's.
pub const MACHINE_OPEN_WINDOW_MS: i64 = 10_000;

/// What was hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HitKind {
    Open,
    /// Link N of the content version.
    Click(i64),
    /// A link the template wrote, by the URL its token was made for.
    TemplateLink(Arc<str>),
}

/// One request to `/o/TOKEN`, `/c/TOKEN/N` or `/l/TOKEN?u=URL` with a
/// genuine token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub campaign: i64,
    pub recipient: i64,
    pub version: i64,
    pub kind: HitKind,
    /// When it came (ms since the epoch).
    pub at: i64,
    /// It came from a known mail proxy (by user agent or address).
    pub proxy: bool,
}

/// What recording one hit changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The recipient's first open (of its kind: human or machine) or
    /// first click of this campaign.
    pub first: bool,
    /// An open counted as a machine's.
    pub machine: bool,
}

/// Per campaign: unique recipients and totals.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Queryable, serde::Serialize, utoipa::ToSchema,
)]
pub struct Engagement {
    /// Recipients who opened (not counting machine opens).
    pub opened: i64,
    pub opens: i64,
    /// Recipients with a machine open.
    pub machine_opened: i64,
    pub machine_opens: i64,
    pub clicked: i64,
    pub clicks: i64,
    /// Recipients who unsubscribed by this campaign's link.
    pub unsubscribed: i64,
}

/// Record a batch of hits in one transaction. Rows are locked in one
/// order by every writer (recipients' rows by campaign and recipient,
/// then the campaigns' counter rows by campaign; a one-click unsubscribe
/// too), so two writers wait for each other and never deadlock.
pub fn record_batch(conn: &mut Conn, hits: &[Hit]) -> Result<()> {
    let mut hits = hits.to_vec();
    hits.sort_by_key(|h| (h.campaign, h.recipient));
    conn.transaction(|conn| {
        let mut counted: std::collections::BTreeMap<i64, Engagement> = Default::default();
        let mut events = Vec::new();
        for hit in &hits {
            let recorded = record_hit(conn, hit)?;
            if let Some(event) = first_event(hit, recorded) {
                events.push(event);
            }
            let n = counted.entry(hit.campaign).or_default();
            let first = i64::from(recorded.first);
            match (&hit.kind, recorded.machine) {
                (HitKind::Open, true) => {
                    n.machine_opened += first;
                    n.machine_opens += 1;
                }
                (HitKind::Open, false) => {
                    n.opened += first;
                    n.opens += 1;
                }
                (HitKind::Click(_) | HitKind::TemplateLink(_), _) => {
                    n.clicked += first;
                    n.clicks += 1;
                }
            }
        }
        for (campaign, n) in counted {
            add_counts(conn, campaign, &n)?;
        }
        outbox::record(conn, &events)?;
        Ok(())
    })
}

/// The webhook event a hit makes: `opened` for a recipient's first open
/// by a person (machine opens make none), `clicked` for their first
/// click; the same unique recipients `status` counts.
fn first_event(hit: &Hit, recorded: Recorded) -> Option<outbox::NewEvent> {
    let (kind, link, link_url) = match (&hit.kind, recorded) {
        (_, Recorded { first: false, .. }) => return None,
        (HitKind::Open, Recorded { machine: true, .. }) => return None,
        (HitKind::Open, _) => (outbox::EventKind::Opened, None, None),
        (HitKind::Click(n), _) => (outbox::EventKind::Clicked, Some((hit.version, *n)), None),
        (HitKind::TemplateLink(url), _) => {
            (outbox::EventKind::Clicked, None, Some(url.to_string()))
        }
    };
    Some(outbox::NewEvent {
        kind,
        campaign_id: Some(hit.campaign),
        recipient_id: Some(hit.recipient),
        at: hit.at,
        link,
        link_url,
    })
}

/// Add to a campaign's counters.
fn add_counts(conn: &mut Conn, campaign: i64, n: &Engagement) -> Result<()> {
    on!(conn, |x| diesel::insert_into(ce::table)
        .values(ce::campaign_id.eq(campaign))
        .on_conflict_do_nothing()
        .execute(x))?;
    on!(conn, |x| diesel::update(ce::table.find(campaign))
        .set((
            ce::opened.eq(ce::opened + n.opened),
            ce::opens.eq(ce::opens + n.opens),
            ce::machine_opened.eq(ce::machine_opened + n.machine_opened),
            ce::machine_opens.eq(ce::machine_opens + n.machine_opens),
            ce::clicked.eq(ce::clicked + n.clicked),
            ce::clicks.eq(ce::clicks + n.clicks),
            ce::unsubscribed.eq(ce::unsubscribed + n.unsubscribed),
        ))
        .execute(x))?;
    Ok(())
}

/// Record one hit on the recipient's row (and the link's), inside
/// [`record_batch`]'s transaction, which adds what it returns to the
/// campaign's counters. Another write about the hit (a webhook's outbox
/// row) goes beside this call.
fn record_hit(conn: &mut Conn, hit: &Hit) -> Result<Recorded> {
    ensure_row(conn, hit.campaign, hit.recipient)?;
    match &hit.kind {
        HitKind::Open => record_open(conn, hit),
        HitKind::Click(_) | HitKind::TemplateLink(_) => record_click(conn, hit),
    }
}

/// An open: a machine's (a known proxy, or within
/// [`MACHINE_OPEN_WINDOW_MS`] of the send) or a reader's, each with its
/// own first time and count.
fn record_open(conn: &mut Conn, hit: &Hit) -> Result<Recorded> {
    let (c, r, at) = (hit.campaign, hit.recipient, hit.at);
    let row = e::table.find((c, r));
    let machine = hit.proxy || sent_since(conn, c, r, at - MACHINE_OPEN_WINDOW_MS)?;
    let first = if machine {
        let first = on!(conn, |x| diesel::update(
            row.filter(e::first_machine_open_at.is_null())
        )
        .set(e::first_machine_open_at.eq(at))
        .execute(x))?;
        on!(conn, |x| diesel::update(row)
            .set(e::machine_opens.eq(e::machine_opens + 1))
            .execute(x))?;
        first
    } else {
        let first = on!(conn, |x| diesel::update(
            row.filter(e::first_open_at.is_null())
        )
        .set(e::first_open_at.eq(at))
        .execute(x))?;
        on!(conn, |x| diesel::update(row)
            .set(e::opens.eq(e::opens + 1))
            .execute(x))?;
        first
    };
    Ok(Recorded {
        first: first == 1,
        machine,
    })
}

/// A click: the recipient's first click time and count, and the link's.
fn record_click(conn: &mut Conn, hit: &Hit) -> Result<Recorded> {
    let (c, r, at) = (hit.campaign, hit.recipient, hit.at);
    let row = e::table.find((c, r));
    let first = on!(conn, |x| diesel::update(
        row.filter(e::first_click_at.is_null())
    )
    .set(e::first_click_at.eq(at))
    .execute(x))?;
    on!(conn, |x| diesel::update(row)
        .set(e::clicks.eq(e::clicks + 1))
        .execute(x))?;
    match &hit.kind {
        HitKind::Click(n) => {
            on!(conn, |x| diesel::update(l::table.find((
                c,
                hit.version,
                *n
            )))
            .set(l::clicks.eq(l::clicks + 1))
            .execute(x))?;
        }
        HitKind::TemplateLink(url) => super::template_links::count_click(conn, c, url)?,
        HitKind::Open => {}
    }
    Ok(Recorded {
        first: first == 1,
        machine: false,
    })
}

/// The recipient's row, made when missing.
fn ensure_row(conn: &mut Conn, campaign: i64, recipient: i64) -> Result<()> {
    on!(conn, |x| diesel::insert_into(e::table)
        .values((e::campaign_id.eq(campaign), e::recipient_id.eq(recipient)))
        .on_conflict_do_nothing()
        .execute(x))?;
    Ok(())
}

/// Whether the campaign's message to the recipient was sent at or after
/// `since` (ms).
fn sent_since(conn: &mut Conn, campaign: i64, recipient: i64, since: i64) -> Result<bool> {
    let sent: Option<i64> = on!(conn, |x| d::table
        .find((campaign, recipient))
        .filter(d::state.eq(DeliveryState::Sent))
        .select(d::updated_at)
        .first(x)
        .optional())?;
    Ok(sent.is_some_and(|t| t >= since))
}

/// A one-click unsubscribe by `campaign`'s link: the recipient leaves (see
/// [`optouts::unsubscribe`]) and, when that changed them, the campaign
/// counts them once. Returns the status after (`None`: no such recipient).
pub fn unsubscribe(
    conn: &mut Conn,
    campaign: i64,
    recipient: i64,
    reason: &str,
) -> Result<Option<RecipientStatus>> {
    conn.transaction(|conn| {
        if optouts::set_unsubscribed(conn, recipient, reason)? {
            optouts::report_unsubscribed(conn, Some(campaign), recipient)?;
            ensure_row(conn, campaign, recipient)?;
            let first = on!(conn, |x| diesel::update(
                e::table
                    .find((campaign, recipient))
                    .filter(e::unsubscribed_at.is_null())
            )
            .set(e::unsubscribed_at.eq(super::now_ms()))
            .execute(x))? as i64;
            let n = Engagement {
                unsubscribed: first,
                ..Engagement::default()
            };
            add_counts(conn, campaign, &n)?;
        }
        optouts::status_of(conn, recipient)
    })
}

/// The counters of each of `ids` that has any.
pub fn counts(conn: &mut Conn, ids: &[i64]) -> Result<HashMap<i64, Engagement>> {
    let rows: Vec<(i64, Engagement)> = on!(conn, |x| ce::table
        .filter(ce::campaign_id.eq_any(ids))
        .select((
            ce::campaign_id,
            (
                ce::opened,
                ce::opens,
                ce::machine_opened,
                ce::machine_opens,
                ce::clicked,
                ce::clicks,
                ce::unsubscribed,
            ),
        ))
        .load(x))?;
    Ok(rows.into_iter().collect())
}

/// The same numbers counted over the per-recipient rows (checks, audits):
/// what the counters must always equal.
pub fn counted(conn: &mut Conn, campaign: i64) -> Result<Engagement> {
    type Row = (
        Option<i64>,
        i64,
        Option<i64>,
        i64,
        Option<i64>,
        i64,
        Option<i64>,
    );
    let rows: Vec<Row> = on!(conn, |x| e::table
        .filter(e::campaign_id.eq(campaign))
        .select((
            e::first_open_at,
            e::opens,
            e::first_machine_open_at,
            e::machine_opens,
            e::first_click_at,
            e::clicks,
            e::unsubscribed_at,
        ))
        .load(x))?;
    let mut n = Engagement::default();
    for (fo, o, fm, m, fc, c, u) in rows {
        n.opened += i64::from(fo.is_some());
        n.opens += o;
        n.machine_opened += i64::from(fm.is_some());
        n.machine_opens += m;
        n.clicked += i64::from(fc.is_some());
        n.clicks += c;
        n.unsubscribed += i64::from(u.is_some());
    }
    Ok(n)
}

/// Clicks per link of every tracked version: `(version, n, url, clicks)`.
pub fn link_clicks(conn: &mut Conn, campaign: i64) -> Result<Vec<(i64, i64, String, i64)>> {
    Ok(on!(conn, |x| l::table
        .filter(l::campaign_id.eq(campaign))
        .order((l::version, l::n))
        .select((l::version, l::n, l::url, l::clicks))
        .load(x))?)
}

/// The URL of link `n` of a content version (what `/c/TOKEN/N` redirects
/// to); `None` when it has no such link.
pub fn link(conn: &mut Conn, campaign: i64, version: i64, n: i64) -> Result<Option<String>> {
    Ok(on!(conn, |x| l::table
        .find((campaign, version, n))
        .select(l::url)
        .first(x)
        .optional())?)
}
