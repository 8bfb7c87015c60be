//! What `flow report` and the dashboard's flow page read: a flow's entries
//! counted by state and left reason (and by the step they left before),
//! and its step messages by status, found by their idempotency keys.

use diesel::prelude::*;

use super::flows::{flow_entries as e, EntryState};
use super::{on, Conn, Result};

/// A flow's entries counted by (state, left reason).
pub fn entry_counts(
    conn: &mut Conn,
    flow_id: i64,
) -> Result<Vec<(EntryState, Option<String>, i64)>> {
    Ok(on!(conn, |c| e::table
        .filter(e::flow_id.eq(flow_id))
        .group_by((e::state, e::left_reason))
        .select((e::state, e::left_reason, diesel::dsl::count_star()))
        .load(c))?)
}

/// A flow's leavers counted by (the step they were waiting for, reason).
pub fn left_by_step(conn: &mut Conn, flow_id: i64) -> Result<Vec<(i64, Option<String>, i64)>> {
    Ok(on!(conn, |c| e::table
        .filter(e::flow_id.eq(flow_id))
        .filter(e::state.eq(EntryState::Left))
        .group_by((e::next_step, e::left_reason))
        .select((e::next_step, e::left_reason, diesel::dsl::count_star()))
        .load(c))?)
}

/// (idempotency key, status, first open, first click) of a step message.
type StepRow = (Option<String>, String, Option<i64>, Option<i64>);

/// One step message as the report counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepMessage {
    pub key: Option<String>,
    pub status: String,
    /// Its recipient opened it (a person, not a mail proxy) / clicked.
    pub opened: bool,
    pub clicked: bool,
}

/// The step messages of flow `flow_id`, read by the idempotency key's
/// prefix `flow:ID:`, with what their recipients did.
pub fn step_messages(conn: &mut Conn, flow_id: i64) -> Result<Vec<StepMessage>> {
    use super::schema::message_engagement as me;
    use super::schema::messages as m;
    let prefix = format!("flow:{flow_id}:%");
    let rows: Vec<StepRow> = on!(conn, |c| m::table
        .left_join(me::table.on(me::message_id.eq(m::id)))
        .filter(m::idempotency_key.like(prefix))
        .select((
            m::idempotency_key,
            m::status,
            me::first_open_at.nullable(),
            me::first_click_at.nullable(),
        ))
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(key, status, opened, clicked)| StepMessage {
            key,
            status,
            opened: opened.is_some(),
            clicked: clicked.is_some(),
        })
        .collect())
}
