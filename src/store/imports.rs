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

use std::collections::HashMap;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel::upsert::excluded;
use serde_json::{Map, Value};

use super::recipients::{get_or_create_list, RecipientStatus};
use super::schema::{list_members as m, lists as l, recipients as r};
use super::{now_ms, on, Conn, InnerMut, Result};

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
    let keys: Vec<&str> = rows.iter().map(|r| r.email_key.as_str()).collect();
    let (found, marks) = match conn.inner_mut() {
        InnerMut::Sqlite(c) => find_sqlite(c, run, &keys)?,
        InnerMut::Pg(c) => find_pg(c, run, &keys)?,
    };
    let now = now_ms();
    let mut done = Written::default();
    let mut writes = Vec::new();
    // Per write: the id a new recipient gets (an existing one keeps its own).
    let mut new_ids = Vec::new();
    let mut marked = Vec::new();
    for row in rows {
        let Some(f) = found.get(&row.email_key) else {
            done.added += 1;
            writes.push(new_recipient(row, now));
            new_ids.push(row.new_id);
            marked.push(row.email_key.as_str());
            continue;
        };
        let mark = marks.get(&f.0);
        if mark == Some(&Some(run.generation)) {
            done.duplicates.push(row.line);
            continue;
        }
        let (write, kept) = merge(row, f, resubscribe, now);
        done.kept_unsubscribed += u64::from(kept);
        match (mark.is_some(), write.is_some()) {
            (false, _) => done.added += 1,
            (true, true) => done.updated += 1,
            (true, false) => done.unchanged += 1,
        }
        if let Some(write) = write {
            writes.push(write);
            new_ids.push(None);
        }
        marked.push(row.email_key.as_str());
    }
    match conn.inner_mut() {
        InnerMut::Sqlite(c) => {
            upsert_sqlite(c, &writes)?;
            mark_members_sqlite(c, run, &marked)?;
        }
        InnerMut::Pg(c) => {
            // Members by id: the ids of the recipients found, and those the
            // upsert returns for the rows that were not (new recipients).
            let mut ids: Vec<i64> = marked
                .iter()
                .filter_map(|k| found.get(*k).map(|f| f.0))
                .collect();
            ids.extend(
                upsert_pg(c, &writes, &new_ids)?
                    .into_iter()
                    .filter(|(key, _)| !found.contains_key(key))
                    .map(|(_, id)| id),
            );
            mark_members_pg(c, run, &ids)?;
        }
    }
    Ok(done)
}

/// The batch's recipients on file, by key, and the list's marks on those
/// that are members (recipient id → the generation that last wrote it).
type FoundMarks = (HashMap<String, Found>, HashMap<i64, Option<i64>>);

/// [`FoundMarks`] on SQLite: two indexed reads, in process.
fn find_sqlite(c: &mut diesel::SqliteConnection, run: Run, keys: &[&str]) -> Result<FoundMarks> {
    let found: Vec<Found> = r::table
        .filter(r::email_key.eq_any(keys))
        .select((
            r::id,
            r::email_key,
            r::name,
            r::attributes,
            r::status,
            r::status_reason,
            r::status_at,
        ))
        .load(c)?;
    let ids: Vec<i64> = found.iter().map(|f| f.0).collect();
    let marks = m::table
        .filter(m::list_id.eq(run.list_id))
        .filter(m::recipient_id.eq_any(&ids))
        .select((m::recipient_id, m::import_gen))
        .load::<(i64, Option<i64>)>(c)?
        .into_iter()
        .collect();
    let found = found
        .into_iter()
        .filter_map(|f| Some((f.1.clone()?, f)))
        .collect();
    Ok((found, marks))
}

/// A row of [`find_pg`].
#[derive(QueryableByName)]
struct FoundPg {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    email_key: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    attributes: String,
    #[diesel(sql_type = Text)]
    status: RecipientStatus,
    #[diesel(sql_type = Nullable<Text>)]
    status_reason: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    status_at: Option<i64>,
    #[diesel(sql_type = Bool)]
    member: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    import_gen: Option<i64>,
}

/// [`FoundMarks`] on PostgreSQL, in one statement, the recipients locked
/// (an unsubscribe arriving meanwhile waits for this batch and is never
/// overwritten; SQLite's write lock is the transaction's already).
///
/// Each key is looked up on its own (`LATERAL`), which can only be an
/// index probe of `recipients_mailbox`: an import into an empty database
/// grows `recipients` from nothing, and with no statistics yet (autovacuum
/// may be off, and is slow anyway) PostgreSQL planned `email_key = ANY(…)`,
/// and a join with the keys, as a scan of the whole table, every batch: the
/// import grew quadratic (BENCHMARKS.md, "Import into PostgreSQL").
fn find_pg(c: &mut diesel::PgConnection, run: Run, keys: &[&str]) -> Result<FoundMarks> {
    // In key order: two imports of different lists that share recipients
    // lock them in the same order, and so never deadlock.
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    let rows: Vec<FoundPg> = diesel::sql_query(
        "SELECT r.id, r.email_key, r.name, r.attributes, r.status, r.status_reason, \
           r.status_at, m.recipient_id IS NOT NULL AS member, m.import_gen \
         FROM unnest($1::text[]) AS k(key) \
         CROSS JOIN LATERAL (SELECT id, email_key, name, attributes, status, status_reason, \
             status_at FROM recipients WHERE email_key = k.key FOR UPDATE) r \
         LEFT JOIN LATERAL (SELECT recipient_id, import_gen FROM list_members \
             WHERE list_id = $2 AND recipient_id = r.id) m ON true",
    )
    .bind::<Array<Text>, _>(&keys)
    .bind::<BigInt, _>(run.list_id)
    .load(c)?;
    let mut found = HashMap::with_capacity(rows.len());
    let mut marks = HashMap::with_capacity(rows.len());
    for f in rows {
        if f.member {
            marks.insert(f.id, f.import_gen);
        }
        let key = f.email_key.clone();
        let row = (
            f.id,
            Some(f.email_key),
            f.name,
            f.attributes,
            f.status,
            f.status_reason,
            f.status_at,
        );
        found.insert(key, row);
    }
    Ok((found, marks))
}

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

/// Insert or update the rows; an existing recipient keeps the spelling it
/// was first imported with. diesel cannot batch an upsert on SQLite, nor
/// cache one: row by row, each row's statement was parsed and planned anew
/// (two thirds of a 1M import's CPU in SQLite's parser and code
/// generator). The batch goes as one JSON array of rows instead, unpacked
/// by `json_each` in array order (so ids follow the file's order).
fn upsert_sqlite(c: &mut diesel::SqliteConnection, rows: &[Write]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let batch: Vec<_> = rows
        .iter()
        .map(|w| {
            (
                &w.email,
                &w.email_key,
                &w.name,
                &w.attributes,
                w.status.as_str(),
                &w.status_reason,
                w.status_at,
                w.updated_at,
            )
        })
        .collect();
    let json = serde_json::to_string(&batch)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    // `json_extract`, not `->>`, which needs SQLite 3.38 (Debian 11 has
    // 3.34). `WHERE true`: SQLite's grammar needs it between an INSERT's
    // SELECT and its ON CONFLICT.
    diesel::sql_query(
        "INSERT INTO recipients (email, email_key, name, attributes, status, \
           status_reason, status_at, updated_at) \
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), \
           json_extract(value, '$[2]'), json_extract(value, '$[3]'), \
           json_extract(value, '$[4]'), json_extract(value, '$[5]'), \
           json_extract(value, '$[6]'), json_extract(value, '$[7]') \
         FROM json_each(?) WHERE true \
         ON CONFLICT (email_key) DO UPDATE SET name = excluded.name, \
           attributes = excluded.attributes, status = excluded.status, \
           status_reason = excluded.status_reason, status_at = excluded.status_at, \
           updated_at = excluded.updated_at",
    )
    .bind::<diesel::sql_types::Text, _>(json)
    .execute(c)?;
    Ok(())
}

/// A row [`upsert_pg`] wrote.
#[derive(QueryableByName)]
struct Upserted {
    #[diesel(sql_type = Text)]
    email_key: String,
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// [`upsert_sqlite`] on PostgreSQL: one statement of nine arrays
/// (`unnest`: the eight columns and each new recipient's id, see
/// [`Row::new_id`]), the same text whatever the batch, instead of nine
/// parameters a row. Returns each row's key and recipient id.
fn upsert_pg(
    c: &mut diesel::PgConnection,
    rows: &[Write],
    new_ids: &[Option<i64>],
) -> Result<Vec<(String, i64)>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let column = |f: fn(&Write) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let written = diesel::sql_query(
        "INSERT INTO recipients (id, email, email_key, name, attributes, status, \
           status_reason, status_at, updated_at) \
         SELECT COALESCE(u.id, nextval(pg_get_serial_sequence('recipients', 'id'))), \
           u.email, u.email_key, u.name, u.attributes, u.status, u.status_reason, \
           u.status_at, u.updated_at \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
           $6::text[], $7::bigint[], $8::bigint[], $9::bigint[]) \
           AS u(email, email_key, name, attributes, status, status_reason, status_at, \
             updated_at, id) \
         ON CONFLICT (email_key) DO UPDATE SET name = excluded.name, \
           attributes = excluded.attributes, status = excluded.status, \
           status_reason = excluded.status_reason, status_at = excluded.status_at, \
           updated_at = excluded.updated_at \
         RETURNING email_key, id",
    )
    .bind::<Array<Text>, _>(column(|w| w.email.clone()))
    .bind::<Array<Text>, _>(column(|w| w.email_key.clone()))
    .bind::<Array<Text>, _>(column(|w| w.name.clone()))
    .bind::<Array<Text>, _>(column(|w| w.attributes.clone()))
    .bind::<Array<Text>, _>(column(|w| w.status.as_str().to_string()))
    .bind::<Array<Nullable<Text>>, _>(
        rows.iter()
            .map(|w| w.status_reason.clone())
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Nullable<BigInt>>, _>(rows.iter().map(|w| w.status_at).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(rows.iter().map(|w| w.updated_at).collect::<Vec<_>>())
    .bind::<Array<Nullable<BigInt>>, _>(new_ids)
    .load::<Upserted>(c)?;
    Ok(written.into_iter().map(|u| (u.email_key, u.id)).collect())
}

/// Make the recipients members of the run's list, marked with its
/// generation.
fn mark_members_sqlite(c: &mut diesel::SqliteConnection, run: Run, keys: &[&str]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    diesel::insert_into(m::table)
        .values(r::table.filter(r::email_key.eq_any(keys)).select((
            run.list_id.into_sql::<BigInt>(),
            r::id,
            Some(run.generation).into_sql::<Nullable<BigInt>>(),
        )))
        .into_columns((m::list_id, m::recipient_id, m::import_gen))
        .on_conflict((m::list_id, m::recipient_id))
        .do_update()
        .set(m::import_gen.eq(excluded(m::import_gen)))
        .execute(c)?;
    Ok(())
}

/// [`mark_members_sqlite`] on PostgreSQL, by recipient id (no second
/// lookup of the keys), one array.
fn mark_members_pg(c: &mut diesel::PgConnection, run: Run, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    diesel::sql_query(
        "INSERT INTO list_members (list_id, recipient_id, import_gen) \
         SELECT $1, id, $2 FROM unnest($3::bigint[]) AS k(id) \
         ON CONFLICT (list_id, recipient_id) DO UPDATE SET import_gen = excluded.import_gen",
    )
    .bind::<BigInt, _>(run.list_id)
    .bind::<BigInt, _>(run.generation)
    .bind::<Array<BigInt>, _>(ids)
    .execute(c)?;
    Ok(())
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
