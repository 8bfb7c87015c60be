//! The global suppression list: addresses and whole `@domains` no campaign,
//! flow or transactional message is sent to. An entry is an address's
//! identity key ([`crate::mailbox::key`]) or `@` and a domain as a
//! lower-case A-label; a domain matches a recipient whose domain is exactly
//! it (never its subdomains). The worker checks a whole batch at claim time
//! with [`matching`]: one statement over the primary key, whatever the
//! list's size.

use std::collections::HashMap;

use diesel::prelude::*;

use super::prepared::{Bind, Prepared};
use super::schema::suppressions as s;
use super::{on, Conn, InnerMut, Result};

/// Entries per statement (SQLite binds each one).
const CHUNK: usize = 500;

/// Whether the list may hold an entry, asked before a look-up: most
/// installations keep none, and on SQLite finding that out is one row's
/// read, where looking up a worker's batch (each address and its domain)
/// cost ~4,500 instructions a message. On PostgreSQL the question would
/// be a round trip of its own, as costly as the look-up it could save:
/// not asked (always `true`).
pub fn may_hold_any(conn: &mut Conn) -> Result<bool> {
    Ok(match conn.inner_mut() {
        InnerMut::Sqlite(c) => {
            diesel::select(diesel::dsl::exists(s::table.select(s::entry))).get_result(c)?
        }
        InnerMut::Pg(_) => true,
    })
}

/// One entry as `suppress ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct Suppression {
    pub entry: String,
    pub reason: String,
    pub created_at: i64,
}

/// `text` as an entry: `@domain` → `@` and the domain as a lower-case
/// A-label; an address → its identity key. `None` when it is neither.
pub fn entry_of(text: &str) -> Option<String> {
    let text = text.trim();
    if let Some(domain) = text.strip_prefix('@') {
        let domain = crate::mailbox::ascii_domain(domain).ok()?;
        return crate::mailbox::is_ldh_name(&domain).then(|| format!("@{domain}"));
    }
    let (local, domain) = text.rsplit_once('@')?;
    if local.is_empty() || local.contains(char::is_whitespace) {
        return None;
    }
    let key = crate::mailbox::key(text).ok()?;
    let (_, ascii) = key.rsplit_once('@')?;
    (crate::mailbox::is_ldh_name(ascii) && !domain.is_empty()).then_some(key)
}

/// The entries that would suppress the address whose key is `key`: the key
/// itself and `@` its domain.
pub fn candidates(key: &str) -> [String; 2] {
    let domain = key.rsplit_once('@').map_or("", |(_, d)| d);
    [key.to_string(), format!("@{domain}")]
}

/// Add `entries` (already [`entry_of`]) with `reason`; an entry already
/// there keeps its first reason. Returns how many were new.
pub fn add(conn: &mut Conn, entries: &[String], reason: &str, now: i64) -> Result<usize> {
    let mut added = 0;
    for chunk in entries.chunks(CHUNK) {
        let rows: Vec<_> = chunk
            .iter()
            .map(|e| (s::entry.eq(e), s::reason.eq(reason), s::created_at.eq(now)))
            .collect();
        added += on!(conn, |c| diesel::insert_into(s::table)
            .values(&rows)
            .on_conflict_do_nothing()
            .execute(c))?;
    }
    Ok(added)
}

/// Remove `entries`; returns how many were there.
pub fn remove(conn: &mut Conn, entries: &[String]) -> Result<usize> {
    let mut gone = 0;
    for chunk in entries.chunks(CHUNK) {
        gone += on!(conn, |c| diesel::delete(
            s::table.filter(s::entry.eq_any(chunk))
        )
        .execute(c))?;
    }
    Ok(gone)
}

/// A page of the list in entry order, after `after`.
pub fn page(conn: &mut Conn, after: Option<&str>, limit: i64) -> Result<Vec<Suppression>> {
    let after = after.unwrap_or("");
    Ok(on!(conn, |c| s::table
        .filter(s::entry.gt(after))
        .order(s::entry)
        .select((s::entry, s::reason, s::created_at))
        .limit(limit)
        .load(c))?)
}

/// How many entries the list holds.
pub fn count(conn: &mut Conn) -> Result<i64> {
    Ok(on!(conn, |c| s::table.count().get_result(c))?)
}

/// Of the addresses whose keys are `keys`, those suppressed, each with
/// its reason (`suppressed`, or `suppressed: REASON`; an address entry
/// wins over its domain's). Asks [`may_hold_any`] first.
pub fn matching(conn: &mut Conn, keys: &[String]) -> Result<HashMap<String, String>> {
    if keys.is_empty() || !may_hold_any(conn)? {
        return Ok(HashMap::new());
    }
    look_up(conn, keys)
}

/// [`matching`] for a caller that has asked [`may_hold_any`] itself (a
/// worker asks before it computes a batch's keys). One indexed statement
/// per [`CHUNK`] entries.
pub fn look_up(conn: &mut Conn, keys: &[String]) -> Result<HashMap<String, String>> {
    let wanted: Vec<String> = {
        let mut w: Vec<String> = keys.iter().flat_map(|k| candidates(k)).collect();
        w.sort_unstable();
        w.dedup();
        w
    };
    let mut found: HashMap<String, String> = HashMap::new();
    match conn.inner_mut() {
        // One fixed text, prepared once per connection: diesel's `eq_any`
        // is one `?` per entry, parsed anew for every job (a worker checks
        // each batch it claims).
        InnerMut::Sqlite(c) => {
            #[derive(QueryableByName)]
            struct Found {
                #[diesel(sql_type = diesel::sql_types::Text)]
                entry: String,
                #[diesel(sql_type = diesel::sql_types::Text)]
                reason: String,
            }
            let json = super::prepared::texts_json(&wanted);
            let rows: Vec<Found> = Prepared::new(
                "SELECT entry, reason FROM suppressions \
                 WHERE entry IN (SELECT value FROM json_each(?))",
                vec![Bind::Json(&json)],
            )
            .load(c)?;
            found.extend(rows.into_iter().map(|f| (f.entry, f.reason)));
        }
        InnerMut::Pg(c) => {
            for chunk in wanted.chunks(CHUNK) {
                let rows: Vec<(String, String)> = s::table
                    .filter(s::entry.eq_any(chunk))
                    .select((s::entry, s::reason))
                    .load(c)?;
                found.extend(rows);
            }
        }
    }
    let mut out = HashMap::new();
    if found.is_empty() {
        return Ok(out);
    }
    for key in keys {
        let [addr, domain] = candidates(key);
        if let Some(reason) = found.get(&addr).or_else(|| found.get(&domain)) {
            out.insert(key.clone(), shown(reason));
        }
    }
    Ok(out)
}

/// Why the address with key `key` is suppressed, if it is.
pub fn reason_for(conn: &mut Conn, key: &str) -> Result<Option<String>> {
    let keys = [key.to_string()];
    Ok(matching(conn, &keys)?.remove(key))
}

/// The reason as the ledger and `report` say it.
fn shown(reason: &str) -> String {
    if reason.is_empty() {
        "suppressed".to_string()
    } else {
        format!("suppressed: {reason}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_fold_case_and_domains_keep_their_at() {
        assert_eq!(
            entry_of(" Ada@Example.COM ").as_deref(),
            Some("ada@example.com")
        );
        assert_eq!(entry_of("@Example.com").as_deref(), Some("@example.com"));
        assert_eq!(entry_of("@bücher.de").as_deref(), Some("@xn--bcher-kva.de"));
        assert_eq!(entry_of("nobody"), None);
        assert_eq!(entry_of("@"), None);
        assert_eq!(entry_of("a b@example.com"), None);
        assert_eq!(entry_of("@bad domain"), None);
    }

    #[test]
    fn a_domain_candidate_is_the_exact_domain() {
        assert_eq!(
            candidates("ada@mail.example.com"),
            [
                "ada@mail.example.com".to_string(),
                "@mail.example.com".to_string()
            ]
        );
    }
}
