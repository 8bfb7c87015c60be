//! `mailsplit rate set|list|delete`.

use crate::cli::args::{Global, RateCommand};
use crate::cli::exit::UsageError;
use crate::cli::out::outln;
use crate::status;
use crate::store::campaigns;
use crate::store::{self, connections, rates, Conn};

use super::{open_migrated, open_read_only, Result};

/// `rate set | list | delete`.
pub fn rate(g: &Global, cmd: RateCommand) -> Result {
    match cmd {
        RateCommand::Set {
            group,
            rate,
            burst,
            connections: sessions,
        } => set(g, &group, &rate, burst, sessions),
        RateCommand::List => list(&mut open_read_only(g)?),
        RateCommand::Delete { group } => delete(&mut open_migrated(g)?, &group),
    }
}

/// Create or change a group, and its connection limit.
fn set(g: &Global, group: &str, rate: &str, burst: Option<u32>, sessions: Option<u32>) -> Result {
    let group = rates::check_name(group)?;
    if sessions.is_some() && !group.starts_with("relay:") {
        return Err(UsageError(format!(
            "--connections applies to relay:HOST:PORT groups, not {group:?}"
        ))
        .into());
    }
    let per_second = crate::ratelimit::parse_rate(rate).ok_or_else(|| {
        UsageError(format!(
            "bad rate {rate:?}: use N/s, N/m or N/h, e.g. 200/s"
        ))
    })?;
    let burst = burst.map_or_else(|| (per_second / 10.0).ceil().max(1.0) as i64, i64::from);
    let mut conn = open_migrated(g)?;
    if let Some(name) = group.strip_prefix("campaign:") {
        let named = match campaigns::find(&mut conn, name) {
            Ok(c) => c.name == name,
            Err(store::StoreError::UnknownCampaign(_)) => false,
            Err(e) => return Err(e.into()),
        };
        if !named {
            return Err(UsageError(format!(
                "bad rate group {group:?}: there is no campaign {name:?}; a campaign group is campaign:NAME with the name of an existing campaign (`mailsplit status` lists them), e.g. campaign:news"
            ))
            .into());
        }
    }
    rates::set(&mut conn, &group, per_second, burst)?;
    // Both writes before anything is printed: a closed stdout stops the
    // printing, never the change.
    match sessions {
        Some(0) => {
            connections::delete(&mut conn, &group)?;
        }
        Some(n) => connections::set(&mut conn, &group, i64::from(n))?,
        None => {}
    }
    outln!("rate group {group}: {per_second:.3}/s, burst {burst}; workers pick it up within 2 s")?;
    match sessions {
        Some(0) => outln!("connection limit of {group} removed")?,
        Some(n) => outln!("connection limit of {group}: {n} sessions across all workers")?,
        None => {}
    }
    Ok(())
}

/// The groups with their configured and observed rates, then the
/// connection limits.
fn list(conn: &mut Conn) -> Result {
    let groups = rates::list(conn)?;
    if groups.is_empty() {
        outln!("no rate groups; add one with `mailsplit rate set GROUP N/s`")?;
    }
    let usage = status::live_usage(conn)?;
    for group in groups {
        outln!("{}", status::rate_line(&group, &usage))?;
    }
    for limit in connections::list(conn)? {
        outln!("{}", status::connections_line(&limit))?;
    }
    Ok(())
}

/// Remove a group and its connection limit.
fn delete(conn: &mut Conn, group: &str) -> Result {
    let had_connections = connections::delete(conn, group)?;
    if !rates::delete(conn, group)? && !had_connections {
        return Err(UsageError(format!(
            "no rate group {group:?}; `mailsplit rate list` shows them"
        ))
        .into());
    }
    outln!("rate group {group} deleted")?;
    Ok(())
}
