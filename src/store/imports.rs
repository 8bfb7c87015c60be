//! The store side of `import`: one import of a list is one
//! generation, and each batch of rows is written under three rules.
//!
//! - Nobody is re-subscribed: a recipient who is not active (unsubscribed,
//!   bounced, complained, whoever recorded it) stays so when a row says
//!   active or says nothing, unless the import was asked to `resubscribe`.
//! - A row changes only what it has: no name leaves the name, attributes
//!   merge key by key (a `Value::Null` clears its key), no status keeps it.
//! - A mailbox the running import already wrote (its membership carries the
//!   import's generation) is a duplicate: the first row wins.
//!
//! `--sync` then removes the members the import never marked ([`sweep`]):
//! one DELETE, whatever the list's size.

use std::collections::{HashMap, HashSet};

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel::upsert::excluded;
use serde_json::{Map, Value};

use super::recipients::{get_or_create_list, RecipientStatus};
use super::schema::{list_members as m, lists as l, recipients as r};
use super::{now_ms, on, Conn, InnerMut, Result};

mod pg;
mod sqlite;
use pg::{find_pg, mark_members_pg, upsert_pg};
use sqlite::{find_sqlite, mark_members_sqlite, upsert_sqlite};

/// Why an import changed a recipient's status (`status_reason`).
const REASON_IMPORT: &str = "import";

/// One import of one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub list_id: i64,
    /// Marks the memberships this import wrote.
    pub generation: i64,
}

/// Start an import of list `name`, creating the list if needed.
pub fn begin(conn: &mut Conn, name: &str) -> Result<Run> {
    let list_id = get_or_create_list(conn, name)?;
    conn.transaction(|conn| {
        on!(conn, |c| diesel::update(l::table.find(list_id))
            .set(l::import_gen.eq(l::import_gen + 1))
            .execute(c))?;
        let generation = on!(conn, |c| l::table
            .find(list_id)
            .select(l::import_gen)
            .first(c))?;
        Ok(Run {
            list_id,
            generation,
        })
    })
}

/// Ready the caller's transaction for one batch (PostgreSQL; SQLite has
/// nothing to change). Its commit is deferred, so [`make_durable`] must
/// follow before the import reports done.
///
/// - `plan_cache_mode = auto`: every new membership fires two foreign-key
///   checks, each a saved plan; under the connections' `force_custom_plan`
///   (see `store::plans`) each check was planned afresh, and those checks
///   were two thirds of the membership insert's time.
/// - `synchronous_commit = off`: the batch's commit returns without
///   waiting for the disk, an fsync less per batch. The import is not done
///   until [`make_durable`] has flushed them all; a server crash before
///   that loses the last batches of an import that never reported success,
///   and running it again writes them.
pub fn begin_batch(conn: &mut Conn) -> Result<()> {
    match conn.backend() {
        super::Backend::Postgres => conn
            .execute_batch("SET LOCAL plan_cache_mode = auto; SET LOCAL synchronous_commit = off"),
        super::Backend::Sqlite => Ok(()),
    }
}

/// Return once every batch committed after [`begin_batch`] is on disk: a
/// transaction with an id, committed synchronously, waits for the log to
/// be flushed up to its commit record, and the log is flushed in order,
/// so the deferred commits before it are flushed too.
pub fn make_durable(conn: &mut Conn) -> Result<()> {
    match conn.backend() {
        super::Backend::Postgres => {
            conn.execute_atomic("SET LOCAL synchronous_commit = on; SELECT txid_current()")
        }
        super::Backend::Sqlite => Ok(()),
    }
}

/// `n` new ids of `recipients`, ascending (PostgreSQL): a batch's rows
/// take them in source order, so new recipients are numbered as the
/// source lists them however the batch is then split (see
/// [`Row::new_id`]). The ids of rows that turn out to be known are
/// skipped, a gap in the sequence and nothing else.
pub fn draw_ids(conn: &mut Conn, n: usize) -> Result<Vec<i64>> {
    #[derive(QueryableByName)]
    struct Drawn {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let InnerMut::Pg(c) = conn.inner_mut() else {
        return Ok(Vec::new());
    };
    let mut ids: Vec<i64> = diesel::sql_query(
        "SELECT nextval(pg_get_serial_sequence('recipients', 'id')) AS id \
         FROM generate_series(1, $1)",
    )
    .bind::<BigInt, _>(n as i64)
    .load::<Drawn>(c)?
    .into_iter()
    .map(|d| d.id)
    .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// One validated row: only what its source has.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Line (or row number) in the source, for reports.
    pub line: u64,
    pub email: String,
    /// See [`crate::mailbox::key`].
    pub email_key: String,
    pub name: Option<String>,
    /// Keys to set; `Value::Null` removes the key.
    pub attributes: Map<String, Value>,
    pub status: Option<RecipientStatus>,
    /// The id this row's recipient gets if it is new; `None`: the next of
    /// the table's sequence. PostgreSQL's import draws them in source order
    /// ([`draw_ids`]) before a batch is split across its writers.
    pub new_id: Option<i64>,
}

/// What one batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    /// Rows whose recipient was not on the list before.
    pub added: u64,
    /// Members whose name, attributes or status changed.
    pub updated: u64,
    /// Members the row did not change.
    pub unchanged: u64,
    /// Rows saying active for a recipient who is not (left as is).
    pub kept_unsubscribed: u64,
    /// Lines of rows whose mailbox this import had written already.
    pub duplicates: Vec<u64>,
    /// Rows of addresses erased at their owner's request
    /// ([`super::forgotten`]): nothing written.
    pub forgotten: u64,
}

/// A row as inserted or updated.
#[derive(Debug, Clone, Insertable)]
#[diesel(table_name = r)]
struct Write {
    email: String,
    email_key: String,
    name: String,
    attributes: String,
    status: RecipientStatus,
    status_reason: Option<String>,
    status_at: Option<i64>,
    updated_at: i64,
}

/// A recipient as the batch finds it.
type Found = (
    i64,
    Option<String>,
    String,
    String,
    RecipientStatus,
    Option<String>,
    Option<i64>,
);

/// Write one batch (no key twice; at most 1,000 rows on SQLite, for its
/// parameter limit) in the caller's transaction.
pub fn write_batch(conn: &mut Conn, run: Run, rows: &[Row], resubscribe: bool) -> Result<Written> {
    let all: Vec<&str> = rows.iter().map(|r| r.email_key.as_str()).collect();
    let forgotten = super::forgotten::among(conn, &all)?;
    let keys: Vec<&str> = all
        .iter()
        .copied()
        .filter(|k| !forgotten.contains(k))
        .collect();
    let (found, marks) = match conn.inner_mut() {
        InnerMut::Sqlite(c) => find_sqlite(c, run, &keys)?,
        InnerMut::Pg(c) => find_pg(c, run, &keys)?,
    };
    let (done, plan) = plan_batch(rows, run, &forgotten, &found, &marks, resubscribe);
    match conn.inner_mut() {
        InnerMut::Sqlite(c) => {
            upsert_sqlite(c, &plan.writes)?;
            mark_members_sqlite(c, run, &plan.marked)?;
        }
        InnerMut::Pg(c) => {
            // Members by id: the ids of the recipients found, and those the
            // upsert returns for the rows that were not (new recipients).
            let mut ids: Vec<i64> = plan
                .marked
                .iter()
                .filter_map(|k| found.get(*k).map(|f| f.0))
                .collect();
            ids.extend(
                upsert_pg(c, &plan.writes, &plan.new_ids)?
                    .into_iter()
                    .filter(|(key, _)| !found.contains_key(key))
                    .map(|(_, id)| id),
            );
            mark_members_pg(c, run, &ids)?;
        }
    }
    super::flows::joined(conn, run.list_id, &plan.joined)?;
    Ok(done)
}

/// What a batch writes: the recipients' rows, the list's marks, and who
/// joins the list's flows.
struct Plan<'a> {
    writes: Vec<Write>,
    /// Per write: the id a new recipient gets (an existing one keeps its own).
    new_ids: Vec<Option<i64>>,
    /// The keys whose membership this run marks.
    marked: Vec<&'a str>,
    /// Mailboxes that were not members of the list: they join its flows.
    joined: Vec<&'a str>,
}

/// Decide, per row, what the batch writes and what it counts.
fn plan_batch<'a>(
    rows: &'a [Row],
    run: Run,
    forgotten: &HashSet<&str>,
    found: &HashMap<String, Found>,
    marks: &HashMap<i64, Option<i64>>,
    resubscribe: bool,
) -> (Written, Plan<'a>) {
    let now = now_ms();
    let mut done = Written::default();
    let mut plan = Plan {
        writes: Vec::new(),
        new_ids: Vec::new(),
        marked: Vec::new(),
        joined: Vec::new(),
    };
    for row in rows {
        if forgotten.contains(row.email_key.as_str()) {
            done.forgotten += 1;
            continue;
        }
        let Some(f) = found.get(&row.email_key) else {
            done.added += 1;
            plan.writes.push(new_recipient(row, now));
            plan.new_ids.push(row.new_id);
            plan.marked.push(row.email_key.as_str());
            plan.joined.push(row.email_key.as_str());
            continue;
        };
        let mark = marks.get(&f.0);
        if mark == Some(&Some(run.generation)) {
            done.duplicates.push(row.line);
            continue;
        }
        let (write, kept) = merge(row, f, resubscribe, now);
        done.kept_unsubscribed += u64::from(kept);
        if mark.is_none() {
            plan.joined.push(row.email_key.as_str());
        }
        match (mark.is_some(), write.is_some()) {
            (false, _) => done.added += 1,
            (true, true) => done.updated += 1,
            (true, false) => done.unchanged += 1,
        }
        if let Some(write) = write {
            plan.writes.push(write);
            plan.new_ids.push(None);
        }
        plan.marked.push(row.email_key.as_str());
    }
    (done, plan)
}

/// The batch's recipients on file, by key, and the list's marks on those
/// that are members (recipient id → the generation that last wrote it).
type FoundMarks = (HashMap<String, Found>, HashMap<i64, Option<i64>>);

/// A recipient nobody had on file.
fn new_recipient(row: &Row, now: i64) -> Write {
    let status = row.status.unwrap_or(RecipientStatus::Active);
    let left = status != RecipientStatus::Active;
    Write {
        email: row.email.clone(),
        email_key: row.email_key.clone(),
        name: row.name.clone().unwrap_or_default(),
        attributes: Value::Object(merged(Map::new(), &row.attributes)).to_string(),
        status,
        status_reason: left.then(|| REASON_IMPORT.to_string()),
        status_at: left.then_some(now),
        updated_at: now,
    }
}

/// `row` applied to the recipient on file: the row to write if anything
/// changed, and whether the row's "active" was refused.
fn merge(row: &Row, f: &Found, resubscribe: bool, now: i64) -> (Option<Write>, bool) {
    let (_, _, name, attributes, status, reason, at) = f;
    let before: Map<String, Value> = serde_json::from_str(attributes).unwrap_or_default();
    let after = merged(before.clone(), &row.attributes);
    let new_name = row.name.as_ref().unwrap_or(name);
    let (new_status, kept) = decide(*status, row.status, resubscribe);
    if new_name == name && after == before && new_status == *status {
        return (None, kept);
    }
    let (reason, at) = match new_status {
        s if s == *status => (reason.clone(), *at),
        RecipientStatus::Active => (None, Some(now)),
        _ => (Some(REASON_IMPORT.to_string()), Some(now)),
    };
    let write = Write {
        email: row.email.clone(),
        email_key: row.email_key.clone(),
        name: new_name.clone(),
        attributes: Value::Object(after).to_string(),
        status: new_status,
        status_reason: reason,
        status_at: at,
        updated_at: now,
    };
    (Some(write), kept)
}

/// The status after an import: a row without one, or saying active, never
/// makes active somebody who is not, unless `resubscribe`; a recipient not
/// active keeps mailsplit's own record of why. True when a row's
/// "active" was refused.
pub fn decide(
    now: RecipientStatus,
    wanted: Option<RecipientStatus>,
    resubscribe: bool,
) -> (RecipientStatus, bool) {
    use RecipientStatus::Active;
    let wanted = wanted.unwrap_or(Active);
    match (now, wanted) {
        (Active, w) => (w, false),
        (_, Active) if resubscribe => (Active, false),
        (n, Active) => (n, true),
        (n, _) => (n, false),
    }
}

/// `attributes` with `changes` applied key by key (`Null` removes).
pub(super) fn merged(
    mut attributes: Map<String, Value>,
    changes: &Map<String, Value>,
) -> Map<String, Value> {
    for (key, value) in changes {
        if value.is_null() {
            attributes.remove(key);
        } else {
            attributes.insert(key.clone(), value.clone());
        }
    }
    attributes
}

/// The list's members now.
pub fn member_count(conn: &mut Conn, run: Run) -> Result<u64> {
    let n: i64 = on!(conn, |c| m::table
        .filter(m::list_id.eq(run.list_id))
        .count()
        .get_result(c))?;
    Ok(n as u64)
}

/// After a complete `--sync` import: remove from the list every member
/// the import did not name (their recipient rows, ledger and other lists
/// stay). Returns the members removed.
pub fn sweep(conn: &mut Conn, run: Run) -> Result<u64> {
    let removed = on!(conn, |c| diesel::delete(
        m::table
            .filter(m::list_id.eq(run.list_id))
            .filter(m::import_gen.is_null().or(m::import_gen.ne(run.generation)))
    )
    .execute(c))?;
    Ok(removed as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RecipientStatus::{Active, Bounced, Unsubscribed};

    #[test]
    fn nobody_is_resubscribed_without_asking() {
        assert_eq!(decide(Unsubscribed, None, false), (Unsubscribed, true));
        assert_eq!(decide(Bounced, Some(Active), false), (Bounced, true));
        assert_eq!(decide(Bounced, Some(Active), true), (Active, false));
        assert_eq!(decide(Bounced, Some(Unsubscribed), true), (Bounced, false));
        assert_eq!(
            decide(Active, Some(Unsubscribed), false),
            (Unsubscribed, false)
        );
        assert_eq!(decide(Active, None, false), (Active, false));
    }

    #[test]
    fn attributes_merge_key_by_key() {
        let before = serde_json::json!({"city": "Paris", "coupon": "X"});
        let changes = serde_json::json!({"coupon": null, "tier": "gold"});
        let after = merged(
            before.as_object().unwrap().clone(),
            changes.as_object().unwrap(),
        );
        assert_eq!(
            Value::Object(after),
            serde_json::json!({"city": "Paris", "tier": "gold"})
        );
    }
}
