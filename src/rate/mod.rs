//! `mailsplit rate`: the shared rate groups and relay connection limits
//! every worker obeys, as an operator sets, lists and deletes them. The
//! workers' side of the same rows is [`crate::rate::limiter`].

pub mod limiter;
pub mod warmup;

use crate::campaign::status;
use crate::rate_group::Group;
use crate::store::{connections, rates, Conn, StoreError};

/// Why a rate group could not be set or deleted.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// A group, rate or option the user typed that makes no sense.
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A group to set: its name, rate and burst as typed, and the relay's
/// connection limit (`Some(0)` removes it).
#[derive(Debug, Clone)]
pub struct SetRequest<'a> {
    pub group: &'a str,
    pub rate: &'a str,
    pub burst: Option<u32>,
    pub connections: Option<u32>,
}

/// A group as [`set`] stored it.
#[derive(Debug, Clone)]
pub struct Set {
    /// The group's name as stored.
    pub group: String,
    pub parsed: Group,
    pub per_second: f64,
    pub burst: i64,
    pub connections: Option<u32>,
}

/// Check a request that needs no database: the group's name, the rate and
/// burst within their maximums ([`crate::rate::limiter::setting`]), that
/// `--connections` is for a relay; returns the request with the
/// group's canonical name, the rate per second and the burst.
pub fn check(req: &SetRequest<'_>) -> Result<Set, LimitError> {
    let checked = crate::rate::limiter::setting(req.group, req.rate, req.burst)
        .map_err(|e| LimitError::Bad(e.to_string()))?;
    let group = checked.group;
    if req.connections.is_some() && !matches!(group, Group::Relay(_)) {
        return Err(LimitError::Bad(format!(
            "--connections applies to relay:HOST:PORT groups, not {:?}",
            group.to_string()
        )));
    }
    Ok(Set {
        group: group.to_string(),
        parsed: group,
        per_second: checked.per_second,
        burst: checked.burst,
        connections: req.connections,
    })
}

/// Store a checked group (a `campaign:` group must name a campaign), and
/// its connection limit.
pub fn set(conn: &mut Conn, set: &Set) -> Result<(), LimitError> {
    let group = &set.group;
    if let Group::Campaign(name) = &set.parsed {
        if !rates::campaign_exists(conn, name)? {
            return Err(LimitError::Bad(format!(
                "bad rate group {group:?}: there is no campaign {name:?}; a campaign group is campaign:NAME with the name of an existing campaign (`mailsplit status` lists them), e.g. campaign:news"
            )));
        }
    }
    rates::set(conn, group, set.per_second, set.burst)?;
    match set.connections {
        Some(0) => {
            connections::delete(conn, group)?;
        }
        Some(n) => connections::set(conn, group, i64::from(n))?,
        None => {}
    }
    Ok(())
}

/// Remove a group and its connection limit.
pub fn delete(conn: &mut Conn, group: &str) -> Result<(), LimitError> {
    let had_connections = connections::delete(conn, group)?;
    let name = rates::check_name(group).unwrap_or_else(|_| group.to_string());
    crate::store::warmups::delete(conn, &name)?;
    if !rates::delete(conn, group)? && !had_connections {
        return Err(LimitError::Bad(format!(
            "no rate group {group:?}; `mailsplit rate list` shows them"
        )));
    }
    Ok(())
}

/// Every group and connection limit, one line each, as `rate list` and
/// `status` show them.
#[derive(Debug, Default)]
pub struct Overview {
    /// Configured and observed rate, parked and deferred, per group.
    pub rates: Vec<String>,
    /// Connections allowed and in use, per relay.
    pub connections: Vec<String>,
}

/// The [`Overview`] now.
pub fn overview(conn: &mut Conn) -> Result<Overview, StoreError> {
    let groups = rates::list(conn)?;
    let rate_lines = if groups.is_empty() {
        Vec::new()
    } else {
        let usage = status::live_usage(conn)?;
        groups
            .iter()
            .map(|g| status::rate_line(g, &usage))
            .collect()
    };
    let warm = warmup::lines(conn)?;
    let rate_lines = rate_lines
        .into_iter()
        .zip(&groups)
        .map(|(line, g)| match warm.iter().find(|(n, _)| n == &g.name) {
            Some((_, w)) => format!("{line}\n{w}"),
            None => line,
        })
        .collect();
    let connection_lines = connections::list(conn)?
        .iter()
        .map(status::connections_line)
        .collect();
    Ok(Overview {
        rates: rate_lines,
        connections: connection_lines,
    })
}
