//! Deleting a campaign made by mistake: only a draft (nothing enqueued,
//! nothing sent), with everything that belongs to it, in one transaction.

use diesel::prelude::*;

use super::campaigns::{self, Campaign, CampaignState};
use super::schema::{campaign_counters as cc, campaigns as c, deliveries as d};
use super::{content, on, Conn, Result};

/// Delete the campaign if it is still a draft. `Ok(None)`: deleted;
/// `Ok(Some(campaign))`: not a draft (as it is now), nothing changed.
pub fn delete_draft(conn: &mut Conn, name_or_id: &str) -> Result<Option<Campaign>> {
    conn.transaction(|conn| {
        let found = campaigns::find(conn, name_or_id)?;
        if found.state != CampaignState::Draft {
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
        // Conditional: an `enqueue` that started meanwhile keeps it.
        let gone = on!(conn, |x| diesel::delete(
            c::table
                .filter(c::id.eq(id))
                .filter(c::state.eq(CampaignState::Draft))
        )
        .execute(x))?;
        if gone == 1 {
            return Ok(None);
        }
        Err(super::StoreError::IllegalTransition {
            campaign: found.name.clone(),
            action: "delete",
            state: "enqueuing".into(),
        })
    })
}
