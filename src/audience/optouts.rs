//! `mailsplit optouts`: every recipient who unsubscribed, bounced or
//! complained, so a shop can update its own table with one query.
//! Streamed in keyset pages (constant memory); `--since` (RFC 3339) keeps
//! only status changes at or after that moment, for incremental runs.

use std::collections::HashMap;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::clock::{rfc3339, Precision};
use crate::store::optouts::{self, Left};
use crate::store::{campaigns, Conn, RecipientStatus, StoreError};

/// Recipients read per page.
const PAGE: i64 = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum OptoutError {
    #[error("--since {0:?} is not an RFC 3339 time (e.g. 2026-11-26T09:00:00Z)")]
    BadSince(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OptoutError {
    pub fn is_usage(&self) -> bool {
        match self {
            OptoutError::BadSince(_) => true,
            OptoutError::Store(e) => e.is_usage(),
        }
    }
}

/// One recipient who left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OptOut {
    pub email: String,
    /// `unsubscribed`, `bounced` or `complained`.
    pub what: &'static str,
    /// When (RFC 3339, UTC); `None` for changes older than mailsplit kept.
    pub when: Option<String>,
    /// The campaign it came from, when known.
    pub campaign: Option<String>,
}

/// Parse `--since` into milliseconds since the epoch.
pub fn parse_since(text: &str) -> Result<i64, OptoutError> {
    let at = OffsetDateTime::parse(text.trim(), &Rfc3339)
        .map_err(|_| OptoutError::BadSince(text.to_string()))?;
    Ok((at.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Hand every opt-out (since `since`, ms) to `each`, a page at a time.
pub fn export<E: From<OptoutError>>(
    conn: &mut Conn,
    since: Option<i64>,
    mut each: impl FnMut(&[OptOut]) -> Result<(), E>,
) -> Result<(), E> {
    let mut names: HashMap<i64, Option<String>> = HashMap::new();
    let mut after = 0;
    loop {
        let page = optouts::left_page(conn, since, after, PAGE).map_err(OptoutError::from)?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = last.id;
        let ids: Vec<i64> = page.iter().map(|l| l.id).collect();
        let events: HashMap<i64, i64> = optouts::event_campaigns(conn, &ids)
            .map_err(OptoutError::from)?
            .into_iter()
            .collect();
        let mut out = Vec::with_capacity(page.len());
        for left in page {
            let campaign = match campaign_of(&left, &events) {
                Some(id) => name_of(conn, &mut names, id)?,
                None => None,
            };
            out.push(OptOut {
                what: what(&left),
                when: left.at.map(|ms| rfc3339(ms, Precision::AsNeeded)),
                email: left.email,
                campaign,
            });
        }
        each(&out)?;
    }
}

/// A campaign's name, looked up once per run.
fn name_of(
    conn: &mut Conn,
    names: &mut HashMap<i64, Option<String>>,
    id: i64,
) -> Result<Option<String>, OptoutError> {
    if let Some(name) = names.get(&id) {
        return Ok(name.clone());
    }
    let name = campaigns::get(conn, id)?.map(|c| c.name);
    names.insert(id, name.clone());
    Ok(name)
}

/// What the recipient did: complaints are stored as unsubscribes whose
/// reason says so (see `bounce`).
fn what(left: &Left) -> &'static str {
    let reason = left.reason.as_deref().unwrap_or("");
    match left.status {
        RecipientStatus::Bounced => "bounced",
        _ if reason.starts_with("complaint") => "complained",
        _ => "unsubscribed",
    }
}

/// The campaign behind the change: the one-click link's (named in the
/// reason `serve` stores), else the latest bounce or complaint event's.
fn campaign_of(left: &Left, events: &HashMap<i64, i64>) -> Option<i64> {
    let reason = left.reason.as_deref().unwrap_or("");
    if let Some(rest) = reason.strip_prefix("one-click unsubscribe (campaign ") {
        return rest.trim_end_matches(')').parse().ok();
    }
    let reported = reason.starts_with("complaint") || reason.starts_with("opt-out report");
    if left.status == RecipientStatus::Unsubscribed && !reported {
        return None;
    }
    events.get(&left.id).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        let ms = parse_since("2026-11-26T10:00:00.250+01:00").unwrap();
        assert_eq!(rfc3339(ms, Precision::AsNeeded), "2026-11-26T09:00:00.25Z");
        assert!(parse_since("yesterday").is_err());
    }
}
