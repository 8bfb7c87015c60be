//! `mailsplit status` and `mailsplit workers`: what is going on.

use crate::campaign;
use crate::cli::args::Global;
use crate::cli::out::outln;
use crate::rate;
use crate::worker::fleet;

use super::{open_read_only, Result};

/// Counts, state, rate and ETA of one or all campaigns; then, unless
/// `json`, the rate groups and connection limits.
pub fn status(g: &Global, campaign: Option<&str>, json: bool) -> Result {
    let mut conn = open_read_only(g)?;
    for shown in campaign::statuses(&mut conn, campaign)? {
        if json {
            outln!("{}", serde_json::to_string(&shown)?)?;
        } else {
            outln!("{}", shown.render())?;
        }
    }
    if json {
        return Ok(());
    }
    let all = rate::overview(&mut conn)?;
    if !all.rates.is_empty() {
        outln!("rate groups:")?;
        for line in &all.rates {
            outln!("  {line}")?;
        }
    }
    if let Some(lines) = crate::campaign::status::unverified_lines(&mut conn)? {
        outln!("{lines}")?;
    }
    if !all.connections.is_empty() {
        outln!("connection limits:")?;
        for line in &all.connections {
            outln!("  {line}")?;
        }
    }
    let (fleet, _) = fleet::load(&mut conn)?;
    for note in fleet.shared_tubes() {
        outln!("{note}")?;
    }
    Ok(())
}

/// The worker fleet, as a table or one JSON object per worker.
pub fn workers(g: &Global, json: bool) -> Result {
    let (fleet, now) = fleet::load(&mut open_read_only(g)?)?;
    if json {
        for w in &fleet.workers {
            outln!("{}", serde_json::to_string(w)?)?;
        }
    } else {
        outln!("{}", fleet.render(now))?;
    }
    Ok(())
}
