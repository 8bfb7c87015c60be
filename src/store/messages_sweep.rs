//! The messages ledger as the sweep for lost jobs reads it (see
//! `messages::sweep`). `next_attempt_at` says when a waiting message's
//! next attempt is due: when it was stored (a flow's step: when its job
//! was put, [`queued_at`]), or the end of the delay it was
//! put back with for a retry ([`due_again`], while its claim still holds
//! it, so the sweep never sees it `queued` without it). A message still
//! waiting long after that has no job left on the queue; the index on
//! (status, next_attempt_at) of the messages in flight (`queued`,
//! `claimed`, `sending`: a partial index, migration 102) finds those
//! without reading the rest of the ledger.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};

use super::messages::MessageStatus;
use super::prepared::{Bind, Prepared};
use super::schema::messages as m;
use super::{on, Conn, InnerMut, Result};

/// A message that waits for a job that did not come.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName, Queryable)]
pub struct Waiting {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// Its idempotency key (a flow's step: `flow:FLOW:ENTRY:STEP`).
    #[diesel(sql_type = Nullable<Text>)]
    pub idempotency_key: Option<String>,
    /// When its next attempt fell due.
    #[diesel(sql_type = BigInt)]
    pub next_attempt_at: i64,
}

impl Waiting {
    /// Where a page that ended with this message leaves off.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            next_attempt_at: self.next_attempt_at,
            id: self.id,
        }
    }
}

/// Where a page of [`lost`] goes on: after this (due time, id), in the
/// order the index gives (many messages share a due time: a flow batch's
/// hundred, put at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub next_attempt_at: i64,
    pub id: i64,
}

impl Cursor {
    /// Before every message: where a sweep's first page starts.
    pub const START: Cursor = Cursor {
        next_attempt_at: i64::MIN,
        id: i64::MIN,
    };
}

/// The waiting messages of one status after a cursor, oldest due first:
/// through the index, its equality on `status` and its range on
/// `next_attempt_at` (the cursor's due time its lower bound, its id the
/// tie-break).
/// The status is a literal, one text per status (each still prepared
/// once): the index holds only the statuses in flight, and a planner uses
/// it only when it can prove the WHERE implies that, which a bound
/// `status = ?` never lets it (SQLite's, nor PostgreSQL's generic plans).
macro_rules! lost_text {
    ($status:literal) => {
        concat!(
            "SELECT id, idempotency_key, next_attempt_at FROM messages WHERE status = '",
            $status,
            "' AND next_attempt_at < ? AND next_attempt_at >= ? AND claimed_until < ? \
             AND (next_attempt_at > ? OR id > ?) ORDER BY next_attempt_at, id LIMIT ?"
        )
    };
}

/// [`lost`]'s query for messages in `status`: `None` for a status with an
/// outcome (never waiting, not in the index).
pub fn lost_sql(status: MessageStatus) -> Option<&'static str> {
    match status {
        MessageStatus::Queued => Some(lost_text!("queued")),
        MessageStatus::Claimed => Some(lost_text!("claimed")),
        MessageStatus::Sending => Some(lost_text!("sending")),
        _ => None,
    }
}

/// The statuses a lost job leaves a message in, and the claim's end each
/// must be past: a `queued` one no worker holds; a `claimed` or `sending`
/// one whose worker died (its claim lapsed before `before` too), which
/// a job would take over, or fail as in doubt.
fn statuses(now: i64, before: i64) -> [(MessageStatus, i64); 3] {
    [
        (MessageStatus::Queued, now),
        (MessageStatus::Claimed, before),
        (MessageStatus::Sending, before),
    ]
}

/// Up to `limit` messages whose next attempt fell due before `before`
/// and that no live claim holds at `now`, after `after`, in cursor order.
pub fn lost(
    conn: &mut Conn,
    now: i64,
    before: i64,
    after: Cursor,
    limit: i64,
) -> Result<Vec<Waiting>> {
    let mut out: Vec<Waiting> = Vec::new();
    for (status, claim_ends) in statuses(now, before) {
        let Some(sql) = lost_sql(status) else {
            continue;
        };
        let binds = vec![
            Bind::Int(before),
            Bind::Int(after.next_attempt_at),
            Bind::Int(claim_ends),
            Bind::Int(after.next_attempt_at),
            Bind::Int(after.id),
            Bind::Int(limit),
        ];
        let rows: Vec<Waiting> = on!(conn, |c| Prepared::new(sql, binds).load(c))?;
        out.extend(rows);
    }
    // Each status's page is in cursor order; together, the first `limit`.
    out.sort_by_key(Waiting::cursor);
    out.truncate(usize::try_from(limit).unwrap_or(0));
    Ok(out)
}

/// Those of `ids` that still wait as [`lost`] found them: due before
/// `before`, in no live claim at `now`. By id (the primary key; see
/// `batch::unindexed`: a literal status would lead SQLite's planner to
/// the index of every message in flight).
pub fn still_lost(conn: &mut Conn, ids: &[i64], now: i64, before: i64) -> Result<Vec<Waiting>> {
    use super::messages::batch::{unindexed, HELD};
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let queued = unindexed().eq("queued").and(m::claimed_until.lt(now));
    let lapsed = unindexed().eq_any(HELD).and(m::claimed_until.lt(before));
    Ok(on!(conn, |c| m::table
        .filter(m::id.eq_any(ids))
        .filter(m::next_attempt_at.lt(before))
        .filter(queued.or(lapsed))
        .select((m::id, m::idempotency_key, m::next_attempt_at))
        .order(m::id)
        .load::<Waiting>(c))?)
}

/// The jobs of messages `ids` were put again at `now`: each waits a whole
/// grace period again before the next sweep may put it once more (only
/// those still as [`lost`] found them: one a worker put back for a retry
/// meanwhile keeps its own due time).
pub fn mark_put(conn: &mut Conn, ids: &[i64], before: i64, now: i64) -> Result<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(on!(conn, |c| diesel::update(
        m::table
            .filter(m::id.eq_any(ids))
            .filter(m::next_attempt_at.lt(before))
    )
    .set(m::next_attempt_at.eq(now))
    .execute(c))?)
}

/// The jobs of messages `ids` were put at `at`: their next attempt is due
/// from then (a flow's batch is stored a while before its jobs are put).
/// By id only: with `status = 'queued'` in the WHERE, SQLite's planner took
/// the (status, next_attempt_at) index and read every queued message for
/// each batch (a quarter of a worker's time at 100k queued). A message a
/// worker already took meanwhile moves its due time by milliseconds at
/// most, which no sweep can tell.
pub fn queued_at(conn: &mut Conn, ids: &[i64], at: i64) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    on!(conn, |c| diesel::update(
        m::table
            .filter(m::id.eq_any(ids))
            .filter(m::next_attempt_at.lt(at))
    )
    .set(m::next_attempt_at.eq(at))
    .execute(c))?;
    Ok(())
}

/// Messages `ids`, held under claim `token`, are about to go back to
/// `queued` for a retry whose job comes back at `at`: their next attempt
/// is due then (in the transaction that records them, before they are
/// `queued`).
pub fn due_again(conn: &mut Conn, ids: &[i64], token: i64, at: i64) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    on!(conn, |c| diesel::update(
        m::table
            .filter(m::id.eq_any(ids))
            .filter(m::claim_token.eq(token))
            // By id, not through the status index (see `batch::unindexed`).
            .filter(super::messages::batch::unindexed().eq_any(super::messages::batch::HELD))
    )
    .set(m::next_attempt_at.eq(at))
    .execute(c))?;
    Ok(())
}

/// The database's plan for [`lost`]'s query of `status`, one line per
/// step: SQLite's `EXPLAIN QUERY PLAN`; on PostgreSQL the generic plan
/// (`EXPLAIN EXECUTE` under `force_generic_plan`), the one a worker's
/// connection keeps once the ledger is large (see `plans`), made without
/// the bound values. What shows that it reads the index, not the ledger.
pub fn lost_plan(conn: &mut Conn, status: MessageStatus) -> Result<String> {
    #[derive(QueryableByName)]
    struct SqliteStep {
        #[diesel(sql_type = Text)]
        detail: String,
    }
    #[derive(QueryableByName)]
    struct PgStep {
        #[diesel(sql_type = Text)]
        #[diesel(column_name = "QUERY PLAN")]
        plan: String,
    }
    let Some(sql) = lost_sql(status) else {
        return Ok(String::new());
    };
    let lines: Vec<String> = match conn.inner_mut() {
        InnerMut::Sqlite(c) => {
            let sql = format!("EXPLAIN QUERY PLAN {sql}");
            let mut binds: Vec<Bind> = (0..5).map(|_| Bind::Int(0)).collect();
            binds.push(Bind::Int(1000));
            let steps: Vec<SqliteStep> = Prepared::new(&sql, binds).load(c)?;
            steps.into_iter().map(|s| s.detail).collect()
        }
        InnerMut::Pg(c) => c.transaction(|c| {
            c.batch_execute(&format!(
                "SET LOCAL plan_cache_mode = force_generic_plan; \
                 PREPARE mailsplit_lost_plan AS {}",
                numbered(sql)
            ))?;
            let steps: Vec<PgStep> =
                diesel::sql_query("EXPLAIN EXECUTE mailsplit_lost_plan(0, 0, 0, 0, 0, 1000)")
                    .load(c)?;
            c.batch_execute("DEALLOCATE mailsplit_lost_plan")?;
            Ok::<_, diesel::result::Error>(steps.into_iter().map(|s| s.plan).collect())
        })?,
    };
    Ok(lines.join("\n"))
}

/// `sql` with each `?` numbered as PostgreSQL's `PREPARE` wants (`$1`, …).
fn numbered(sql: &str) -> String {
    let mut parts = sql.split('?');
    let mut out = parts.next().unwrap_or_default().to_string();
    for (i, part) in parts.enumerate() {
        out.push_str(&format!("${}{part}", i + 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_in_flight_has_its_text_naming_it() {
        for status in [
            MessageStatus::Queued,
            MessageStatus::Claimed,
            MessageStatus::Sending,
        ] {
            let sql = lost_sql(status).expect("a status in flight has a query");
            assert!(
                sql.contains(&format!("status = '{}' AND", status.as_str())),
                "{sql}"
            );
            assert_eq!(sql.matches('?').count(), 6, "{sql}");
        }
        assert_eq!(lost_sql(MessageStatus::Sent), None);
    }

    #[test]
    fn postgres_placeholders_are_numbered_in_order() {
        assert_eq!(
            numbered("a = ? AND b < ? LIMIT ?"),
            "a = $1 AND b < $2 LIMIT $3"
        );
        assert_eq!(numbered("no marks"), "no marks");
    }
}
