//! `mailsplit status` and `mailsplit workers`: what is going on.

use crate::cli::args::Global;
use crate::cli::out::outln;
use crate::fleet;
use crate::status::{self, CampaignStatus};
use crate::store::{self, campaigns, connections, rates, workers, Conn};

use super::{open_read_only, Result};

/// Counts, state, rate and ETA of one or all campaigns; then, unless
/// `json`, the rate groups and connection limits.
pub fn status(g: &Global, campaign: Option<&str>, json: bool) -> Result {
    let mut conn = open_read_only(g)?;
    let rows = match campaign {
        Some(name) => {
            let c = campaigns::find(&mut conn, name)?;
            let counters = campaigns::counters(&mut conn, c.id)?;
            vec![(c, counters)]
        }
        None => campaigns::list(&mut conn)?,
    };
    for (c, counters) in rows {
        let shown = CampaignStatus::new(&c, &counters);
        if json {
            outln!("{}", serde_json::to_string(&shown)?)?;
        } else {
            outln!("{}", shown.render())?;
        }
    }
    if !json {
        limits(&mut conn)?;
    }
    Ok(())
}

/// The rate groups and connection limits under `status`.
fn limits(conn: &mut Conn) -> Result {
    let groups = rates::list(conn)?;
    if !groups.is_empty() {
        let usage = status::live_usage(conn)?;
        outln!("rate groups:")?;
        for group in groups {
            outln!("  {}", status::rate_line(&group, &usage))?;
        }
    }
    let limits = connections::list(conn)?;
    if !limits.is_empty() {
        outln!("connection limits:")?;
        for limit in limits {
            outln!("  {}", status::connections_line(&limit))?;
        }
    }
    Ok(())
}

/// The worker fleet, as a table or one JSON object per worker.
pub fn workers(g: &Global, json: bool) -> Result {
    let mut conn = open_read_only(g)?;
    let now = store::now_ms();
    let fleet = fleet::view(workers::list(&mut conn)?, now);
    if json {
        for w in &fleet.workers {
            outln!("{}", serde_json::to_string(w)?)?;
        }
    } else {
        outln!("{}", fleet.render(now))?;
    }
    Ok(())
}
