//! Recipients leaving: a one-click unsubscribe (written by `serve`), and
//! the workers' look-up of recent status changes, so that a message already
//! composed for somebody who just left is skipped instead of sent.

use diesel::prelude::*;

use super::schema::recipients as r;
use super::{now_ms, on, Conn, RecipientStatus, Result};

/// Unsubscribe a recipient, recording why and when. Only an active
/// recipient changes (a bounced one keeps its status and reason), so
/// repeating it is harmless. Returns the status after, or `None` when no
/// such recipient exists.
pub fn unsubscribe(
    conn: &mut Conn,
    recipient_id: i64,
    reason: &str,
) -> Result<Option<RecipientStatus>> {
    conn.transaction(|conn| {
        on!(conn, |c| diesel::update(
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
        Ok(on!(conn, |c| r::table
            .find(recipient_id)
            .select(r::status)
            .first(c)
            .optional())?)
    })
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
