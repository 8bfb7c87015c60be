//! Deleting a campaign made by mistake: only while nothing was sent for
//! it (a draft, or a scheduled campaign before its start), with everything
//! that belongs to it, in one transaction. A campaign deleted after
//! `enqueue` leaves its id in `deleted_campaigns`: its jobs still wait in
//! beanstalkd, and a worker that meets one deletes it ([`was_deleted`])
//! instead of burying it as a job of a campaign that never existed.

use diesel::prelude::*;

use super::campaigns::{self, Campaign, CampaignState};
use super::schema::{
    campaign_counters as cc, campaigns as c, deleted_campaigns as gone, deliveries as d,
};
use super::{content, now_ms, on, Conn, DeliveryState, Result};

/// Delete the campaign if nothing was sent for it: a draft, or enqueued
/// (not enqueuing) with its start time still ahead and no message sent
/// or failed. `Ok(None)`: deleted; `Ok(Some(campaign))`: it is past that
/// (as it is now), nothing changed.
pub fn delete_draft(conn: &mut Conn, name_or_id: &str) -> Result<Option<Campaign>> {
    conn.transaction(|conn| {
        let found = campaigns::find(conn, name_or_id)?;
        let now = now_ms();
        let scheduled = found.state == CampaignState::Queued
            && found.send_at.is_some_and(|at| at > now)
            && nothing_sent(conn, found.id)?;
        if found.state != CampaignState::Draft && !scheduled {
            return Ok(Some(found));
        }
        let id = found.id;
        content::delete(conn, id)?;
        on!(conn, |x| diesel::delete(
            d::table.filter(d::campaign_id.eq(id))
        )
        .execute(x))?;
        on!(conn, |x| diesel::delete(
            cc::table.filter(cc::campaign_id.eq(id))
        )
        .execute(x))?;
        // Conditional: an `enqueue` that started meanwhile, or the start,
        // keeps it.
        let gone_now = on!(conn, |x| diesel::delete(
            c::table.filter(c::id.eq(id)).filter(
                c::state
                    .eq(CampaignState::Draft)
                    .or(c::state.eq(CampaignState::Queued).and(c::send_at.gt(now)))
            )
        )
        .execute(x))?;
        if gone_now != 1 {
            return Err(super::StoreError::IllegalTransition {
                campaign: found.name.clone(),
                action: "delete",
                state: "enqueuing or started".into(),
            });
        }
        if scheduled {
            on!(conn, |x| diesel::insert_into(gone::table)
                .values((
                    gone::id.eq(id),
                    gone::name.eq(&found.name),
                    gone::deleted_at.eq(now),
                ))
                .execute(x))?;
        }
        Ok(None)
    })
}

/// No message of the campaign was sent or failed (counters and ledger).
fn nothing_sent(conn: &mut Conn, id: i64) -> Result<bool> {
    let counters = campaigns::counters(conn, id)?;
    if counters.sent + counters.failed > 0 {
        return Ok(false);
    }
    let outcomes: i64 = on!(conn, |x| d::table
        .filter(d::campaign_id.eq(id))
        .filter(d::state.eq_any([DeliveryState::Sent, DeliveryState::Failed]))
        .count()
        .get_result(x))?;
    Ok(outcomes == 0)
}

/// Whether campaign `id` was deleted after `enqueue` (its jobs are to be
/// dropped).
pub fn was_deleted(conn: &mut Conn, id: i64) -> Result<bool> {
    let n: i64 = on!(conn, |x| gone::table
        .filter(gone::id.eq(id))
        .count()
        .get_result(x))?;
    Ok(n > 0)
}
