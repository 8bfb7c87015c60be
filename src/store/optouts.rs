//! Recipients leaving: a one-click unsubscribe (written by `serve`), and
//! the workers' look-up of recent status changes, so that a message already
//! composed for somebody who just left is skipped instead of sent.

use diesel::prelude::*;

use super::outbox;
use super::schema::recipients as r;
use super::{now_ms, on, Conn, RecipientStatus, Result};

/// Unsubscribe a recipient, recording why and when, outside any campaign's
/// link (a campaign's one-click link goes through
/// `engagement::unsubscribe`, which also counts it for the campaign). Only
/// an active recipient changes (a bounced one keeps its status and
/// reason), so repeating it is harmless; a change is reported to the
/// webhooks that want `unsubscribed` events, in the same transaction.
/// Returns the status after, or `None` when no such recipient exists.
pub fn unsubscribe(
    conn: &mut Conn,
    recipient_id: i64,
    reason: &str,
) -> Result<Option<RecipientStatus>> {
    conn.transaction(|conn| {
        if set_unsubscribed(conn, recipient_id, reason)? {
            report_unsubscribed(conn, None, recipient_id)?;
        }
        status_of(conn, recipient_id)
    })
}

/// Tell the webhooks that want `unsubscribed` events (in the caller's
/// transaction, beside the change it reports).
pub fn report_unsubscribed(
    conn: &mut Conn,
    campaign_id: Option<i64>,
    recipient_id: i64,
) -> Result<()> {
    let event = outbox::NewEvent {
        kind: outbox::EventKind::Unsubscribed,
        campaign_id,
        recipient_id: Some(recipient_id),
        at: now_ms(),
        link: None,
        link_url: None,
    };
    outbox::record(conn, &[event])?;
    Ok(())
}

/// Unsubscribe the recipient if active; whether that changed them.
pub fn set_unsubscribed(conn: &mut Conn, recipient_id: i64, reason: &str) -> Result<bool> {
    let changed = on!(conn, |c| diesel::update(
        r::table
            .find(recipient_id)
            .filter(r::status.eq(RecipientStatus::Active))
    )
    .set((
        r::status.eq(RecipientStatus::Unsubscribed),
        r::status_reason.eq(reason),
        r::status_at.eq(now_ms()),
        r::updated_at.eq(now_ms()),
    ))
    .execute(c))?;
    Ok(changed == 1)
}

/// A recipient's status; `None` when no such recipient exists.
pub fn status_of(conn: &mut Conn, recipient_id: i64) -> Result<Option<RecipientStatus>> {
    Ok(on!(conn, |c| r::table
        .find(recipient_id)
        .select(r::status)
        .first(c)
        .optional())?)
}

/// Recipients no longer active whose status changed after `since` (ms),
/// oldest change first, at most `limit`: `(id, status, status_at)`.
pub fn left_since(
    conn: &mut Conn,
    since: i64,
    limit: i64,
) -> Result<Vec<(i64, RecipientStatus, i64)>> {
    let rows: Vec<(i64, RecipientStatus, Option<i64>)> = on!(conn, |c| r::table
        .filter(r::status_at.gt(since))
        .filter(r::status.ne(RecipientStatus::Active))
        .order(r::status_at)
        .select((r::id, r::status, r::status_at))
        .limit(limit)
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(id, status, at)| (id, status, at.unwrap_or(since)))
        .collect())
}

/// One recipient who is not active, as `mailsplit optouts` reads it.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct Left {
    pub id: i64,
    pub email: String,
    pub status: RecipientStatus,
    pub reason: Option<String>,
    /// When the status changed (ms); unknown for old rows.
    pub at: Option<i64>,
}

/// One keyset page of the recipients who are not active, with an id above
/// `after` and (when given) a status change at or after `since` (ms), in
/// id order. Constant memory however many there are.
pub fn left_page(conn: &mut Conn, since: Option<i64>, after: i64, limit: i64) -> Result<Vec<Left>> {
    // A boxed query belongs to one backend: built in each arm.
    macro_rules! page {
        ($c:expr) => {{
            let mut q = r::table
                .filter(r::id.gt(after))
                .filter(r::status.ne(RecipientStatus::Active))
                .order(r::id)
                .select((r::id, r::email, r::status, r::status_reason, r::status_at))
                .limit(limit)
                .into_boxed();
            if let Some(since) = since {
                q = q.filter(r::status_at.ge(since));
            }
            q.load($c)?
        }};
    }
    Ok(match conn.inner_mut() {
        super::InnerMut::Sqlite(c) => page!(c),
        super::InnerMut::Pg(c) => page!(c),
    })
}

/// The campaign of the latest bounce or complaint event of each recipient
/// among `ids` that has one: `(recipient, campaign)`.
pub fn event_campaigns(conn: &mut Conn, ids: &[i64]) -> Result<Vec<(i64, i64)>> {
    use super::schema::bounces as b;
    let rows: Vec<(i64, Option<i64>)> = on!(conn, |c| b::table
        .filter(b::recipient_id.eq_any(ids))
        .filter(b::campaign_id.is_not_null())
        .order(b::id)
        .select((b::recipient_id, b::campaign_id))
        .load(c))?;
    Ok(rows
        .into_iter()
        .filter_map(|(r, c)| Some((r, c?)))
        .collect())
}
