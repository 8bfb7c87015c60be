//! `/api/v1` keys: a name, the SHA-256 of the key (never the key), its
//! scopes. A key is looked up by its hash on every request, so a revoke
//! (a DELETE) refuses it from the very next request.

use diesel::prelude::*;

use super::schema::api_keys as k;
use super::{on, Conn, Result};

text_enum! {
    /// What a key may do.
    pub enum Scope ("API key scope (send, subscribers, campaigns, read)") {
        /// `POST /api/v1/messages`.
        Send = "send",
        /// Subscriber writes.
        Subscribers = "subscribers",
        /// Campaign writes.
        Campaigns = "campaigns",
        /// Every GET.
        Read = "read",
    }
}

/// A key as `apikey ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub name: String,
    pub scopes: Vec<Scope>,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}

/// `send,read` → its scopes; an unknown one is `StoreError::BadValue`.
pub fn parse_scopes(text: &str) -> Result<Vec<Scope>> {
    let mut scopes = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let scope: Scope = part.parse()?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    scopes.sort();
    Ok(scopes)
}

fn join(scopes: &[Scope]) -> String {
    let names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    names.join(",")
}

/// Store a new key by its hash; false when the name is taken.
pub fn create(conn: &mut Conn, name: &str, hash: &str, scopes: &[Scope], now: i64) -> Result<bool> {
    let added = on!(conn, |c| diesel::insert_into(k::table)
        .values((
            k::name.eq(name),
            k::key_hash.eq(hash),
            k::scopes.eq(join(scopes)),
            k::created_at.eq(now),
        ))
        .on_conflict_do_nothing()
        .execute(c))?;
    Ok(added > 0)
}

type Row = (String, String, i64, Option<i64>);

fn read(row: Row) -> Result<ApiKey> {
    Ok(ApiKey {
        name: row.0,
        scopes: parse_scopes(&row.1)?,
        created_at: row.2,
        last_used_at: row.3,
    })
}

/// Every key, by name.
pub fn list(conn: &mut Conn) -> Result<Vec<ApiKey>> {
    let rows: Vec<Row> = on!(conn, |c| k::table
        .select((k::name, k::scopes, k::created_at, k::last_used_at))
        .order(k::name.asc())
        .load(c))?;
    rows.into_iter().map(read).collect()
}

/// The key whose hash is `hash`, marked used at `now`; `None` for no key
/// (never made, or revoked). The hash is the unique index's exact match:
/// a guess learns nothing from timing but whether its hash exists.
pub fn authenticate(conn: &mut Conn, hash: &str, now: i64) -> Result<Option<ApiKey>> {
    let row: Option<Row> = on!(conn, |c| k::table
        .filter(k::key_hash.eq(hash))
        .select((k::name, k::scopes, k::created_at, k::last_used_at))
        .first(c)
        .optional())?;
    let Some(row) = row else { return Ok(None) };
    // Minute granularity: `ls` needs no more, and most requests then read
    // without writing.
    if row.3.is_none_or(|at| now - at >= 60_000) {
        on!(conn, |c| diesel::update(k::table.find(&row.0))
            .set(k::last_used_at.eq(now))
            .execute(c))?;
    }
    read(row).map(Some)
}

/// Delete key `name`; false when there was none.
pub fn revoke(conn: &mut Conn, name: &str) -> Result<bool> {
    Ok(on!(conn, |c| diesel::delete(k::table.find(name)).execute(c))? > 0)
}
