//! Archive (hide from the dashboard) a finished campaign, or show it
//! again. Only a campaign that is done or cancelled is archived: one that
//! may still send must stay in sight.

use super::status::{CampaignStatus, Phase};
use super::CampaignError;
use crate::store::{archive, campaigns, now_ms, Conn};

/// Archive campaign `name` (`on`) or show it again; its id.
pub fn archive(conn: &mut Conn, name: &str, on: bool) -> Result<i64, CampaignError> {
    let c = campaigns::find(conn, name)?;
    if !on {
        archive::unset(conn, c.id)?;
        return Ok(c.id);
    }
    let counters = campaigns::counters(conn, c.id)?;
    let state = CampaignStatus::new(&c, &counters).state;
    if !matches!(state, Phase::Done | Phase::Cancelled) {
        return Err(CampaignError::Bad(format!(
            "campaign {:?} is {state}: only a finished (done or cancelled) campaign can be archived; cancel it first (`mailsplit cancel {}`) if it should never send",
            c.name, c.name
        )));
    }
    archive::set(conn, c.id, now_ms())?;
    Ok(c.id)
}
