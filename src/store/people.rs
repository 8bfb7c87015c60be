//! The admin dashboard's reads about people: subscribers found by a
//! prefix of their address, and what one of them was sent, both indexed
//! and bounded so a page stays fast with millions of recipients.
//!
//! The search is a byte range on `email_key` (the mailbox folded to lower
//! case, [`crate::mailbox::key`]), so a prefix matches in any case: on
//! SQLite the unique index on `email_key` serves it; on PostgreSQL the
//! range is compared under `COLLATE "C"`, served by the index migration
//! 98 adds, whatever the database's own collation.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::{Bool, Text};

use super::recipients::RecipientStatus;
use super::schema::{campaigns as cp, deliveries as d, engagement as e, recipients as r};
use super::url::Backend;
use super::{on, Conn, Result};

/// One subscriber in the search's results.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub email: String,
    pub name: String,
    pub status: RecipientStatus,
    /// The key the results are ordered and paged by.
    pub key: String,
}

/// Above every character a prefix can be followed by: the range's end.
const PAST: char = char::MAX;

/// Subscribers whose folded address starts with `prefix` (folded here the
/// same way), in key order, those after `after` only, at most `limit`.
pub fn search(
    conn: &mut Conn,
    prefix: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Found>> {
    let low = fold(prefix);
    let high = format!("{low}{PAST}");
    let from = match after {
        Some(a) if a > low.as_str() => a.to_string(),
        _ => low.clone(),
    };
    let col = match conn.backend() {
        Backend::Postgres => "email_key COLLATE \"C\"",
        Backend::Sqlite => "email_key",
    };
    let op = if after.is_some() { ">" } else { ">=" };
    let range = sql::<Bool>(&format!("{col} {op} "))
        .bind::<Text, _>(from)
        .sql(&format!(" AND {col} < "))
        .bind::<Text, _>(high);
    let order = sql::<Text>(col);
    let rows: Vec<(String, String, RecipientStatus, Option<String>)> = on!(conn, |c| r::table
        .filter(range)
        .order(order)
        .select((r::email, r::name, r::status, r::email_key))
        .limit(limit)
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(email, name, status, key)| Found {
            email,
            name,
            status,
            key: key.unwrap_or_default(),
        })
        .collect())
}

/// A prefix folded as [`crate::mailbox::key`] folds a local part: the
/// domain's A-label form is lower-case ASCII too, so a typed domain
/// matches as long as it is written in ASCII.
fn fold(prefix: &str) -> String {
    let p = prefix.trim();
    if p.is_ascii() {
        p.to_ascii_lowercase()
    } else {
        p.to_lowercase()
    }
}

/// One campaign's message to a recipient, with what came of it.
#[derive(Debug, Clone, PartialEq)]
pub struct SentRow {
    pub campaign: String,
    pub state: String,
    /// When the ledger row last changed (sent, failed), ms.
    pub at: i64,
    /// The relay's last reply to a failed attempt.
    pub reply: Option<String>,
    pub opens: i64,
    pub clicks: i64,
    pub bounced_at: Option<i64>,
    pub complained_at: Option<i64>,
}

/// Campaigns looked up per query: each one a primary-key look-up.
const CHUNK: usize = 200;

/// The recipient's ledger rows, newest campaign first, at most `limit`:
/// found through the ledger's primary key (campaign, recipient), a chunk
/// of campaigns at a time, so no query scans the ledger.
pub fn sent(conn: &mut Conn, recipient_id: i64, limit: usize) -> Result<Vec<SentRow>> {
    let campaigns: Vec<(i64, String)> = on!(conn, |c| cp::table
        .order(cp::id.desc())
        .select((cp::id, cp::name))
        .load(c))?;
    let mut out = Vec::new();
    for chunk in campaigns.chunks(CHUNK) {
        let ids: Vec<i64> = chunk.iter().map(|x| x.0).collect();
        type Row = (i64, String, i64, Option<String>, Option<i64>, Option<i64>);
        let mut rows: Vec<Row> = on!(conn, |c| d::table
            .filter(d::campaign_id.eq_any(&ids))
            .filter(d::recipient_id.eq(recipient_id))
            .select((
                d::campaign_id,
                d::state,
                d::updated_at,
                d::last_error,
                d::bounced_at,
                d::complained_at
            ))
            .load(c))?;
        rows.sort_by_key(|x| std::cmp::Reverse(x.0));
        let engaged: Vec<(i64, i64, i64)> = on!(conn, |c| e::table
            .filter(e::campaign_id.eq_any(&ids))
            .filter(e::recipient_id.eq(recipient_id))
            .select((e::campaign_id, e::opens, e::clicks))
            .load(c))?;
        for (cid, state, at, reply, bounced_at, complained_at) in rows {
            let (opens, clicks) = engaged
                .iter()
                .find(|x| x.0 == cid)
                .map_or((0, 0), |x| (x.1, x.2));
            let campaign = chunk.iter().find(|x| x.0 == cid).map(|x| x.1.clone());
            out.push(SentRow {
                campaign: campaign.unwrap_or_default(),
                state,
                at,
                reply,
                opens,
                clicks,
                bounced_at,
                complained_at,
            });
            if out.len() >= limit {
                return Ok(out);
            }
        }
    }
    Ok(out)
}
