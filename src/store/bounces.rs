//! Bounce and complaint events, and what they do to a recipient. One call
//! of [`record`] is one transaction: the event row (once per message and
//! recipient, whoever delivers the report how often), the ledger's mark on
//! the campaign's delivery with its counter (moved by the affected-row
//! count, so `bounced` and `complaints` always equal a `COUNT(*)` over the
//! ledger), and the recipient's new status with the reason. The bounce
//! stage decides what an event means ([`Action`]); this module only writes.

use diesel::prelude::*;

use super::outbox::{self, EventKind};
use super::recipients::RecipientStatus;
use super::schema::{bounces as b, campaign_counters as cc, deliveries as d, recipients as r};
use super::{now_ms, on, Conn, Result};

text_enum! {
    /// What a report says about a recipient.
    pub enum BounceKind ("bounce kind") {
        /// The address is bad: no such mailbox or domain (5.1.x, 5.4.4, …).
        Hard = "hard",
        /// The mailbox exists but could not take it: full, temporarily
        /// failing, or the reporting MTA gave up retrying (4.x.x, 5.2.2).
        Soft = "soft",
        /// A warning only: the reporting MTA is still retrying.
        Delayed = "delayed",
        /// Refused for who sent it, not for where it went (x.7.x: spam
        /// filter, blocklist, authentication); says nothing about the address.
        Policy = "policy",
        /// The recipient reported the message as spam (ARF abuse, JMRP, SES).
        Complaint = "complaint",
        /// Other feedback (ARF opt-out, auth-failure, …).
        Feedback = "feedback",
    }
}

text_enum! {
    /// Where an event came from.
    pub enum BounceSource ("bounce source") {
        /// A report read by `mailsplit bounce` (stdin or Maildir).
        Report = "report",
        /// The relay refused the address at send time.
        Smtp = "smtp",
        /// A provider's webhook (`POST /webhooks/bounce`).
        Webhook = "webhook",
    }
}

impl BounceKind {
    /// Whether the message counts as bounced in its campaign's counters.
    pub fn is_bounce(self) -> bool {
        matches!(
            self,
            BounceKind::Hard | BounceKind::Soft | BounceKind::Policy
        )
    }
}

/// One event to record.
#[derive(Debug, Clone)]
pub struct NewBounce<'a> {
    pub recipient_id: i64,
    /// The campaign the reported message belonged to, when known.
    pub campaign_id: Option<i64>,
    /// The address as the report gave it.
    pub email: &'a str,
    pub kind: BounceKind,
    /// Enhanced status code, or the feedback type.
    pub status: Option<&'a str>,
    pub reason: &'a str,
    pub source: BounceSource,
    /// Names the message the event came from (see the migration).
    pub fingerprint: &'a str,
}

/// What the event does to the recipient.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing beyond recording it.
    Record,
    /// Active → bounced, with this reason.
    Bounce(String),
    /// Active (or bounced) → unsubscribed, with this reason.
    Unsubscribe(String),
    /// Count it: `limit` soft bounces within `window_ms` make the recipient
    /// bounced, with the reason given.
    CountSoft {
        limit: i64,
        window_ms: i64,
        reason: String,
    },
}

/// What [`record`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// False when this message's event for this recipient was recorded
    /// before (a report delivered twice): nothing else was done.
    pub new: bool,
    /// The recipient's status now, if this event changed it.
    pub changed_to: Option<RecipientStatus>,
    /// Soft bounces within the window, this one included (for `CountSoft`).
    pub soft_count: i64,
}

/// Record one event and apply its action, in one transaction.
pub fn record(conn: &mut Conn, e: &NewBounce, action: &Action) -> Result<Recorded> {
    let now = now_ms();
    conn.transaction(|conn| {
        let mut done = Recorded {
            new: insert_event(conn, e, now)?,
            changed_to: None,
            soft_count: 0,
        };
        if !done.new {
            return Ok(done);
        }
        if let Some(campaign_id) = e.campaign_id {
            mark_delivery(conn, campaign_id, e.recipient_id, e.kind, now)?;
        }
        apply(conn, e, action, now, &mut done)?;
        Ok(done)
    })
}

/// Insert the event; false when this message's event for this recipient
/// is on file already.
fn insert_event(conn: &mut Conn, e: &NewBounce, now: i64) -> Result<bool> {
    let inserted = on!(conn, |c| diesel::insert_into(b::table)
        .values((
            b::recipient_id.eq(e.recipient_id),
            b::campaign_id.eq(e.campaign_id),
            b::email.eq(e.email),
            b::kind.eq(e.kind),
            b::status.eq(e.status),
            b::reason.eq(super::clip_line(e.reason, 500)),
            b::source.eq(e.source),
            b::fingerprint.eq(e.fingerprint),
            b::received_at.eq(now),
        ))
        .on_conflict((b::fingerprint, b::recipient_id))
        .do_nothing()
        .execute(c))?;
    Ok(inserted == 1)
}

/// Apply a new event's action to the recipient's status.
fn apply(
    conn: &mut Conn,
    e: &NewBounce,
    action: &Action,
    now: i64,
    done: &mut Recorded,
) -> Result<()> {
    let to = |status, from: &'static [RecipientStatus], reason: &str, conn: &mut Conn| {
        set_status(conn, e.recipient_id, status, from, reason, now)
            .map(|changed| changed.then_some(status))
    };
    use RecipientStatus::{Active, Bounced, Unsubscribed};
    done.changed_to = match action {
        Action::Record => None,
        Action::Bounce(reason) => to(Bounced, &[Active], reason, conn)?,
        // A complaint outranks a bounce: the address works, and its
        // owner does not want the mail.
        Action::Unsubscribe(reason) => to(Unsubscribed, &[Active, Bounced], reason, conn)?,
        Action::CountSoft {
            limit,
            window_ms,
            reason,
        } => {
            done.soft_count = on!(conn, |c| b::table
                .filter(b::recipient_id.eq(e.recipient_id))
                .filter(b::kind.eq(BounceKind::Soft))
                .filter(b::received_at.gt(now - window_ms))
                .count()
                .get_result::<i64>(c))?;
            if done.soft_count >= *limit {
                to(Bounced, &[Active], reason, conn)?
            } else {
                None
            }
        }
    };
    Ok(())
}

/// Mark the campaign's delivery to the recipient as bounced or complained
/// about (once), and move the matching counter by the rows marked.
fn mark_delivery(
    conn: &mut Conn,
    campaign_id: i64,
    recipient_id: i64,
    kind: BounceKind,
    now: i64,
) -> Result<()> {
    let row = d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::recipient_id.eq(recipient_id));
    let marked = if kind.is_bounce() {
        on!(conn, |c| diesel::update(
            row.filter(d::bounced_at.is_null())
        )
        .set(d::bounced_at.eq(Some(now)))
        .execute(c))?
    } else if kind == BounceKind::Complaint {
        on!(conn, |c| diesel::update(
            row.filter(d::complained_at.is_null())
        )
        .set(d::complained_at.eq(Some(now)))
        .execute(c))?
    } else {
        0
    } as i64;
    if marked > 0 {
        let event = if kind.is_bounce() {
            EventKind::Bounced
        } else {
            EventKind::Complained
        };
        outbox::record_recipients(conn, event, campaign_id, &[recipient_id], now)?;
        let counters = cc::table.find(campaign_id);
        on!(conn, |c| if kind.is_bounce() {
            diesel::update(counters)
                .set(cc::bounced.eq(cc::bounced + marked))
                .execute(c)
        } else {
            diesel::update(counters)
                .set(cc::complaints.eq(cc::complaints + marked))
                .execute(c)
        })?;
        if kind == BounceKind::Complaint {
            super::autopause::check_complaints(conn, campaign_id, now)?;
        }
    }
    Ok(())
}

/// Change a recipient's status if it is one of `from`, remembering why and
/// when; true if it changed.
pub fn set_status(
    conn: &mut Conn,
    recipient_id: i64,
    to: RecipientStatus,
    from: &[RecipientStatus],
    reason: &str,
    now: i64,
) -> Result<bool> {
    let changed = on!(conn, |c| diesel::update(
        r::table.find(recipient_id).filter(r::status.eq_any(from))
    )
    .set((
        r::status.eq(to),
        r::status_reason.eq(Some(super::clip_line(reason, 500))),
        r::status_at.eq(Some(now)),
        r::updated_at.eq(now),
    ))
    .execute(c))?;
    Ok(changed == 1)
}

/// One recorded event, as tests and operators read them back.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = b)]
pub struct Event {
    pub recipient_id: i64,
    pub campaign_id: Option<i64>,
    pub email: String,
    pub kind: BounceKind,
    pub status: Option<String>,
    pub reason: String,
    pub source: BounceSource,
}

/// The events of one recipient, oldest first.
pub fn events_of(conn: &mut Conn, recipient_id: i64) -> Result<Vec<Event>> {
    Ok(on!(conn, |c| b::table
        .filter(b::recipient_id.eq(recipient_id))
        .order(b::id)
        .select(Event::as_select())
        .load(c))?)
}

/// Every event, oldest first, at most `limit`.
pub fn recent(conn: &mut Conn, limit: i64) -> Result<Vec<Event>> {
    Ok(on!(conn, |c| b::table
        .order(b::id)
        .select(Event::as_select())
        .limit(limit)
        .load(c))?)
}

/// A recipient's status and why, as stored.
pub fn status_of(
    conn: &mut Conn,
    recipient_id: i64,
) -> Result<Option<(RecipientStatus, Option<String>)>> {
    Ok(on!(conn, |c| r::table
        .find(recipient_id)
        .select((r::status, r::status_reason))
        .first(c)
        .optional())?)
}

/// A recipient by the address a report gave, in any spelling of its
/// mailbox (see [`crate::mailbox::key`]): MTAs lower-case whole addresses,
/// and mail went out with its domain as an A-label.
pub fn find_recipient(conn: &mut Conn, address: &str) -> Result<Option<(i64, String)>> {
    let address = address.trim().trim_start_matches('<').trim_end_matches('>');
    let Ok(key) = crate::mailbox::key(address) else {
        return Ok(None);
    };
    Ok(on!(conn, |c| r::table
        .filter(r::email_key.eq(&key))
        .select((r::id, r::email))
        .first(c)
        .optional())?)
}

/// Whether the ledger says the campaign's message to the recipient went
/// out: a report quoting that message's Message-ID is believed only then.
pub fn was_sent(conn: &mut Conn, campaign_id: i64, recipient_id: i64) -> Result<bool> {
    let n = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::recipient_id.eq(recipient_id))
        .filter(d::state.eq(super::DeliveryState::Sent))
        .count()
        .get_result::<i64>(c))?;
    Ok(n > 0)
}
