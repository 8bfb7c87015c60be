//! Flows started by a query on the shop's database (`--trigger-sql`), in
//! our database: the rows of one poll entering the flow (a page at a time,
//! in one transaction each), the addresses becoming recipients when they
//! are not (an existing recipient keeps its status: an unsubscribed,
//! bounced or complained address never comes back through a flow), and
//! the marks that tell, when a step is due, whether the last complete poll
//! still returned the entry's (email, key): `seen_at` on the entry, the
//! poll's start in the flow's `matched_at`.

use diesel::prelude::*;

use super::flows::{flow_entries as e, flows as f, EntryState, FlowState, Trigger};
use super::recipients::RecipientStatus;
use super::schema::recipients as r;
use super::{on, Conn, Result};

/// One row of a trigger query, checked.
#[derive(Debug, Clone)]
pub struct SqlRow {
    pub email: String,
    /// The mailbox's identity ([`crate::mailbox::key`]).
    pub email_key: String,
    /// The `name` column, for an address that becomes a recipient.
    pub name: Option<String>,
    /// The `key` column: one entry per (email, key).
    pub key: String,
    /// The row as a JSON object (`row.COL` in the step templates).
    pub data: String,
}

/// What one page of rows did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Entered {
    /// Rows that made a new entry.
    pub entered: u64,
    /// Addresses that became recipients.
    pub recipients: u64,
}

/// Enter the rows of a poll that began at `t` into flow `flow_id`, whose
/// first step is `first` ms after the entry: a new (email, key) makes an
/// entry due at `t + first`; one entered before is marked seen at `t`.
/// One transaction: a worker killed mid-page leaves the page undone, and
/// the next poll does it again (the unique index keeps entries once).
pub fn enter_rows(
    conn: &mut Conn,
    flow_id: i64,
    first: i64,
    t: i64,
    rows: &[SqlRow],
) -> Result<Entered> {
    conn.transaction(|conn| {
        let mut done = Entered::default();
        for row in rows {
            let (recipient, new) = recipient(conn, row, t)?;
            done.recipients += u64::from(new);
            let n = on!(conn, |c| diesel::insert_into(e::table)
                .values((
                    e::flow_id.eq(flow_id),
                    e::recipient_id.eq(recipient),
                    e::entry_key.eq(&row.key),
                    e::row_data.eq(&row.data),
                    e::due_at.eq(Some(t + first)),
                    e::state.eq(EntryState::Active),
                    e::entered_at.eq(t),
                    e::updated_at.eq(t),
                    e::seen_at.eq(t),
                ))
                .on_conflict_do_nothing()
                .execute(c))?;
            if n == 1 {
                done.entered += 1;
                continue;
            }
            // Seen again; never moved back (a stalled poll that began
            // earlier may finish after this one).
            on!(conn, |c| diesel::update(
                e::table
                    .filter(e::flow_id.eq(flow_id))
                    .filter(e::recipient_id.eq(recipient))
                    .filter(e::entry_key.eq(&row.key))
                    .filter(e::seen_at.lt(t))
            )
            .set(e::seen_at.eq(t))
            .execute(c))?;
        }
        Ok(done)
    })
}

/// The recipient of `row`'s address, made (active, with the row's name)
/// when there is none; whether it was made.
fn recipient(conn: &mut Conn, row: &SqlRow, t: i64) -> Result<(i64, bool)> {
    let made = on!(conn, |c| diesel::insert_into(r::table)
        .values((
            r::email.eq(&row.email),
            r::email_key.eq(Some(&row.email_key)),
            r::name.eq(row.name.as_deref().unwrap_or("")),
            r::attributes.eq("{}"),
            r::status.eq(RecipientStatus::Active),
            r::updated_at.eq(t),
        ))
        .on_conflict_do_nothing()
        .execute(c))?;
    let id = on!(conn, |c| r::table
        .filter(r::email_key.eq(&row.email_key))
        .select(r::id)
        .first(c))?;
    Ok((id, made == 1))
}

/// Take flow `flow_id`'s poll at `t` if it was last polled at `was`
/// (false: another scheduler took it first).
pub fn claim_poll(conn: &mut Conn, flow_id: i64, was: i64, t: i64) -> Result<bool> {
    let n = on!(conn, |c| diesel::update(
        f::table.find(flow_id).filter(f::polled_at.eq(was))
    )
    .set(f::polled_at.eq(t))
    .execute(c))?;
    Ok(n == 1)
}

/// The poll that began at `t` read every row: entries it did not see are
/// no longer matched.
pub fn matched(conn: &mut Conn, flow_id: i64, t: i64) -> Result<()> {
    on!(conn, |c| diesel::update(
        f::table.find(flow_id).filter(f::matched_at.lt(t))
    )
    .set(f::matched_at.eq(t))
    .execute(c))?;
    Ok(())
}

/// Every SQL-triggered flow.
pub fn sql_flows(conn: &mut Conn) -> Result<Vec<super::flows::Flow>> {
    Ok(on!(conn, |c| f::table
        .filter(f::trigger_kind.eq(Trigger::Sql))
        .order(f::id)
        .select(super::flows::Flow::as_select())
        .load(c))?)
}

/// Whether active flow `flow_id` has an entry due by `now` (its query is
/// then polled at once, so the step goes out on fresh rows).
pub fn has_due(conn: &mut Conn, flow_id: i64, now: i64) -> Result<bool> {
    let due: Vec<i64> = on!(conn, |c| e::table
        .inner_join(f::table.on(f::id.eq(e::flow_id)))
        .filter(e::due_at.le(now))
        .filter(e::flow_id.eq(flow_id))
        .filter(f::state.eq(FlowState::Active))
        .select(e::id)
        .limit(1)
        .load(c))?;
    Ok(!due.is_empty())
}
