//! The deliveries ledger: one row per (campaign, recipient), claimed before a
//! send with a conditional write and finalised after it. A recipient whose row
//! is `sent`, `failed` or `skipped` is never claimed again, whoever holds the
//! job and however often it comes back.

//!
//! [`claim`] takes recipients for a job, [`record`] writes what became of
//! them, and [`pg_fast`] holds the PostgreSQL statements that do either in
//! one round trip.

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use diesel::prelude::*;

use crate::store::prepared::{Bind, Prepared};
use crate::store::recipients::{Recipient, RecipientStatus};
use crate::store::schema::{deliveries as d, recipients};
use crate::store::{autopause, bounces, now_ms, on, Backend, Conn, InnerMut, Result};
/// Rows of one campaign still claimed by `token`.
macro_rules! owned_rows {
    ($campaign_id:expr, $token:expr, $ids:expr) => {
        d::table
            .filter(d::campaign_id.eq($campaign_id))
            .filter(d::recipient_id.eq_any($ids))
            .filter(d::claim_token.eq(Some($token)))
            .filter(d::state.eq(DeliveryState::Claimed))
    };
}

text_enum! {
    /// Where one (campaign, recipient) row of the ledger stands.
    pub enum DeliveryState ("delivery state") {
        /// A worker holds it until `claimed_until`.
        Claimed = "claimed",
        /// Waiting for another try (transient failure, or handed back unsent).
        Retry = "retry",
        Sent = "sent",
        Failed = "failed",
        Skipped = "skipped",
    }
}
/// Rows per statement when claiming on SQLite (7 bound values per row, well
/// under SQLite's limit of 32,766).
const SQLITE_CHUNK: usize = 1_000;
mod claim;
mod counters;
mod pg_fast;
mod record;

pub use claim::{claim, claim_job, extend_claims, Claim, JobClaim};
pub use record::{record, record_batch, Outcome, OutcomeKind, Recorded, Recording};

/// A recipient's columns in a claim's read: all `None` for a membership
/// whose recipient is gone (claimed, then finished with nobody to send
/// to), or on PostgreSQL for a member this claim did not get.
#[derive(QueryableByName)]
struct PersonRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    email: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    name: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    attributes: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    status: Option<RecipientStatus>,
}

impl PersonRow {
    /// Recipient `id`, when its row was read.
    fn recipient(self, id: i64) -> Option<Recipient> {
        Some(Recipient {
            id,
            email: self.email?,
            name: self.name?,
            attributes: self.attributes?,
            status: self.status?,
        })
    }
}

/// How often the observed send rate is recomputed.
pub const RATE_WINDOW_MS: i64 = 5_000;

/// The window in force: [`RATE_WINDOW_MS`], unless the hidden
/// `MAILSPLIT_RATE_WINDOW_MS` (at least 200) sets another. Why: a test of
/// the rate around a pause must pause for longer than two windows, and
/// need not wait for the production ones to do so.
pub fn rate_window_ms() -> i64 {
    static WINDOW: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
        std::env::var("MAILSPLIT_RATE_WINDOW_MS")
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|&ms| ms >= 200)
            .unwrap_or(RATE_WINDOW_MS)
    });
    *WINDOW
}

/// The recipients in `(after, upto]` the ledger has a row for, in id order
/// (an enqueue window: at most a page of the list).
pub fn recipients_in_range(
    conn: &mut Conn,
    campaign_id: i64,
    after: i64,
    upto: i64,
) -> Result<Vec<i64>> {
    Ok(on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::recipient_id.gt(after))
        .filter(d::recipient_id.le(upto))
        .order(d::recipient_id)
        .select(d::recipient_id)
        .load(c))?)
}

/// `COUNT(*)` of the ledger by state: what the counters must always equal.
pub fn ledger_counts(conn: &mut Conn, campaign_id: i64) -> Result<BTreeMap<DeliveryState, i64>> {
    let rows: Vec<(DeliveryState, i64)> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .group_by(d::state)
        .select((d::state, diesel::dsl::count_star()))
        .load(c))?;
    Ok(rows.into_iter().collect())
}

/// Failed recipients of a campaign with the relay's reply, oldest first.
pub fn failures(conn: &mut Conn, campaign_id: i64, limit: i64) -> Result<Vec<(i64, String)>> {
    let rows: Vec<(i64, Option<String>)> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::state.eq(DeliveryState::Failed))
        .order(d::updated_at)
        .select((d::recipient_id, d::last_error))
        .limit(limit)
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(rid, e)| (rid, e.unwrap_or_default()))
        .collect())
}

/// Of `recipient_ids`, those whose delivery in the campaign is final
/// (`sent`, `failed` or `skipped`): what `requeue` leaves out.
pub fn finished_among(
    conn: &mut Conn,
    campaign_id: i64,
    recipient_ids: &[i64],
) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for ids in recipient_ids.chunks(SQLITE_CHUNK) {
        out.extend(on!(conn, |c| d::table
            .filter(d::campaign_id.eq(campaign_id))
            .filter(d::recipient_id.eq_any(ids))
            .filter(d::state.eq_any([
                DeliveryState::Sent,
                DeliveryState::Failed,
                DeliveryState::Skipped
            ]))
            .select(d::recipient_id)
            .load::<i64>(c))?);
    }
    Ok(out)
}

/// Make a campaign's failed deliveries to recipients who are still active
/// claimable again (`requeue --failed`), with fresh attempts, and take them
/// out of the `failed` counter in the same transaction. A recipient whose
/// address bounced, or who unsubscribed, stays failed. Returns how many.
pub fn reopen_failed(conn: &mut Conn, campaign_id: i64) -> Result<i64> {
    use crate::store::schema::campaign_counters as cc;
    let now = now_ms();
    conn.transaction(|conn| {
        let active = recipients::table
            .filter(recipients::status.eq(super::RecipientStatus::Active))
            .select(recipients::id);
        let n = on!(conn, |c| diesel::update(
            d::table
                .filter(d::campaign_id.eq(campaign_id))
                .filter(d::state.eq(DeliveryState::Failed))
                .filter(d::recipient_id.eq_any(active))
        )
        .set((
            d::state.eq(DeliveryState::Retry),
            d::attempts.eq(0),
            d::claim_token.eq(None::<i64>),
            d::updated_at.eq(now),
        ))
        .execute(c))? as i64;
        if n > 0 {
            on!(conn, |c| diesel::update(cc::table.find(campaign_id))
                .set(cc::failed.eq(cc::failed - n))
                .execute(c))?;
        }
        Ok(n)
    })
}
