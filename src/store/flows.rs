//! Flows in the database (issue 39): the flow and its steps, one entry
//! per (flow, recipient, key) made once by a unique index, the scheduler's
//! lease (one row), and the due entries found by the index on `due_at`
//! (never a scan of a flow's members). Every state change of an entry is a
//! conditional UPDATE on the step it was at, so two schedulers (a lease
//! that lapsed under a stalled holder) cannot both advance it.

use diesel::prelude::*;

use super::prepared::Bind;
use super::recipients::RecipientStatus;
use super::schema::{list_members, lists, recipients};
use super::schema::{list_members as lm, lists as l, recipients as r};
use super::{now_ms, on, Conn, Result};

diesel::table! {
    flows (id) {
        id -> BigInt,
        name -> Text,
        trigger_kind -> Text,
        list_id -> Nullable<BigInt>,
        sql_query -> Nullable<Text>,
        sql_source -> Nullable<Text>,
        every_ms -> Nullable<BigInt>,
        polled_at -> BigInt,
        state -> Text,
        created_at -> BigInt,
        matched_at -> BigInt,
        allow_privileged -> Bool,
    }
}

diesel::table! {
    flow_steps (flow_id, n) {
        flow_id -> BigInt,
        n -> BigInt,
        delay_ms -> BigInt,
        template -> Text,
    }
}

diesel::table! {
    flow_entries (id) {
        id -> BigInt,
        flow_id -> BigInt,
        recipient_id -> BigInt,
        entry_key -> Text,
        row_data -> Text,
        next_step -> BigInt,
        due_at -> Nullable<BigInt>,
        state -> Text,
        left_reason -> Nullable<Text>,
        entered_at -> BigInt,
        updated_at -> BigInt,
        seen_at -> BigInt,
    }
}

diesel::table! {
    flow_scheduler (id) {
        id -> BigInt,
        owner -> Nullable<Text>,
        lease_until -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(flows, flow_steps);
diesel::allow_tables_to_appear_in_same_query!(flows, flow_entries);
diesel::allow_tables_to_appear_in_same_query!(flow_entries, recipients);
diesel::allow_tables_to_appear_in_same_query!(flows, lists);
diesel::allow_tables_to_appear_in_same_query!(flow_entries, list_members);
diesel::allow_tables_to_appear_in_same_query!(flows, recipients);

use flow_entries as e;
use flow_steps as s;
use flows as f;

text_enum! {
    /// What makes an entry.
    pub enum Trigger ("flow trigger (join, sql)") {
        Join = "join",
        Sql = "sql",
    }
}

text_enum! {
    /// Whether the scheduler sends a flow's due steps.
    pub enum FlowState ("flow state (active, paused)") {
        Active = "active",
        Paused = "paused",
    }
}

text_enum! {
    /// Where an entry is: waiting for its next step, through every step,
    /// or gone before the end (`left_reason` says why).
    pub enum EntryState ("flow entry state (active, done, left)") {
        Active = "active",
        Done = "done",
        Left = "left",
    }
}

/// One flow as stored.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = f)]
pub struct Flow {
    pub id: i64,
    pub name: String,
    pub trigger_kind: Trigger,
    pub list_id: Option<i64>,
    pub sql_query: Option<String>,
    pub sql_source: Option<String>,
    pub every_ms: Option<i64>,
    pub polled_at: i64,
    pub state: FlowState,
    pub created_at: i64,
    /// SQL trigger: when the last complete poll began.
    pub matched_at: i64,
    /// SQL trigger: the source's user may do more than read.
    pub allow_privileged: bool,
}

/// One step.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = s)]
pub struct Step {
    pub flow_id: i64,
    pub n: i64,
    pub delay_ms: i64,
    pub template: String,
}

/// What `flow create` stores.
pub struct NewFlow<'a> {
    pub name: &'a str,
    pub trigger: Trigger,
    pub list_id: Option<i64>,
    pub sql_query: Option<&'a str>,
    pub sql_source: Option<&'a str>,
    pub every_ms: Option<i64>,
    pub allow_privileged: bool,
    /// (delay, template) in order.
    pub steps: &'a [(i64, String)],
}

/// Store a flow and its steps; `None` when the name is taken.
pub fn create(conn: &mut Conn, n: &NewFlow) -> Result<Option<i64>> {
    conn.transaction(|conn| {
        let now = now_ms();
        let id: Option<i64> = on!(conn, |c| diesel::insert_into(f::table)
            .values((
                f::name.eq(n.name),
                f::trigger_kind.eq(n.trigger),
                f::list_id.eq(n.list_id),
                f::sql_query.eq(n.sql_query),
                f::sql_source.eq(n.sql_source),
                f::every_ms.eq(n.every_ms),
                f::allow_privileged.eq(n.allow_privileged),
                f::state.eq(FlowState::Active),
                f::created_at.eq(now),
            ))
            .on_conflict_do_nothing()
            .returning(f::id)
            .get_result(c)
            .optional())?;
        let Some(id) = id else { return Ok(None) };
        for (i, (delay, template)) in n.steps.iter().enumerate() {
            on!(conn, |c| diesel::insert_into(s::table)
                .values((
                    s::flow_id.eq(id),
                    s::n.eq(i as i64),
                    s::delay_ms.eq(*delay),
                    s::template.eq(template),
                ))
                .execute(c))?;
        }
        Ok(Some(id))
    })
}

pub fn find(conn: &mut Conn, name: &str) -> Result<Option<Flow>> {
    Ok(on!(conn, |c| f::table
        .filter(f::name.eq(name))
        .select(Flow::as_select())
        .first(c)
        .optional())?)
}

pub fn by_id(conn: &mut Conn, id: i64) -> Result<Option<Flow>> {
    Ok(on!(conn, |c| f::table
        .find(id)
        .select(Flow::as_select())
        .first(c)
        .optional())?)
}

pub fn all(conn: &mut Conn) -> Result<Vec<Flow>> {
    Ok(on!(conn, |c| f::table
        .order(f::name)
        .select(Flow::as_select())
        .load(c))?)
}

pub fn steps(conn: &mut Conn, flow_id: i64) -> Result<Vec<Step>> {
    Ok(on!(conn, |c| s::table
        .filter(s::flow_id.eq(flow_id))
        .order(s::n)
        .select(Step::as_select())
        .load(c))?)
}

/// The name of list `id`.
pub fn list_name(conn: &mut Conn, id: i64) -> Result<Option<String>> {
    Ok(on!(conn, |c| l::table
        .find(id)
        .select(l::name)
        .first(c)
        .optional())?)
}

/// Set a flow's state; false when it was already so.
pub fn set_state(conn: &mut Conn, id: i64, to: FlowState) -> Result<bool> {
    let n = on!(conn, |c| diesel::update(
        f::table.find(id).filter(f::state.ne(to))
    )
    .set(f::state.eq(to))
    .execute(c))?;
    Ok(n == 1)
}

/// Active members of list `list_id` now: what `--include-existing`
/// would enter, and what a flow created without it leaves out.
pub fn active_members(conn: &mut Conn, list_id: i64) -> Result<i64> {
    Ok(on!(conn, |c| lm::table
        .inner_join(r::table.on(r::id.eq(lm::recipient_id)))
        .filter(lm::list_id.eq(list_id))
        .filter(r::status.eq(RecipientStatus::Active))
        .count()
        .get_result(c))?)
}

/// The join flows of a list and their first step's delay.
fn join_flows(conn: &mut Conn, list_id: i64) -> Result<Vec<(i64, i64)>> {
    Ok(on!(conn, |c| f::table
        .inner_join(s::table.on(s::flow_id.eq(f::id).and(s::n.eq(0i64))))
        .filter(f::list_id.eq(list_id))
        .filter(f::trigger_kind.eq(Trigger::Join))
        .select((f::id, s::delay_ms))
        .load(c))?)
}

/// Who enters a flow: the active recipients among these.
#[derive(Debug, Clone, Copy)]
pub enum Entrants<'a> {
    /// Every member of a list (`--include-existing`).
    Members(i64),
    /// The recipients of these mailbox keys (new members).
    Keys(&'a [&'a str]),
}

/// Enter the active recipients among `who` into flow `flow_id`, the
/// first step due `first` ms from now: one INSERT … SELECT, an entry
/// already there kept (the unique index). The number entered.
fn enter(conn: &mut Conn, flow_id: i64, first: i64, who: Entrants) -> Result<u64> {
    use diesel::sql_types::{BigInt, Nullable, Text};
    let now = now_ms();
    let n = on!(conn, |c| {
        let source = r::table
            .filter(r::status.eq(RecipientStatus::Active))
            .into_boxed();
        let source = match who {
            Entrants::Members(list_id) => source.filter(
                r::id.eq_any(
                    lm::table
                        .filter(lm::list_id.eq(list_id))
                        .select(lm::recipient_id),
                ),
            ),
            Entrants::Keys(keys) => source.filter(r::email_key.eq_any(keys)),
        };
        diesel::insert_into(e::table)
            .values(source.select((
                flow_id.into_sql::<BigInt>(),
                r::id,
                Some(now + first).into_sql::<Nullable<BigInt>>(),
                EntryState::Active.as_str().into_sql::<Text>(),
                now.into_sql::<BigInt>(),
                now.into_sql::<BigInt>(),
            )))
            .into_columns((
                e::flow_id,
                e::recipient_id,
                e::due_at,
                e::state,
                e::entered_at,
                e::updated_at,
            ))
            .on_conflict_do_nothing()
            .execute(c)
    })?;
    Ok(n as u64)
}

/// Enter every active member of `list_id` into flow `flow_id`
/// (`--include-existing`); the number entered.
pub fn enter_existing(conn: &mut Conn, flow_id: i64, list_id: i64, first: i64) -> Result<u64> {
    enter(conn, flow_id, first, Entrants::Members(list_id))
}

/// New members of `list_id` (by mailbox key) enter the list's join flows,
/// in the caller's transaction (the import's batch, the API's upsert): an
/// entry exists exactly when the membership does. One query when the list
/// has no flow; one INSERT per flow otherwise.
pub fn joined(conn: &mut Conn, list_id: i64, keys: &[&str]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    for (flow_id, first) in join_flows(conn, list_id)? {
        enter(conn, flow_id, first, Entrants::Keys(keys))?;
    }
    Ok(())
}

/// Take (or renew) the scheduler's lease until `until`; true when `owner`
/// holds it now. A holder that dies stops renewing, and the lease passes
/// to the next worker that asks after `lease_until`.
pub fn lease(conn: &mut Conn, owner: &str, now: i64, until: i64) -> Result<bool> {
    use flow_scheduler as q;
    let taken = on!(conn, |c| diesel::update(
        q::table.find(1i64).filter(
            q::lease_until
                .lt(now)
                .or(q::owner.eq(owner))
                .or(q::owner.is_null())
        )
    )
    .set((q::owner.eq(Some(owner)), q::lease_until.eq(until)))
    .execute(c))?;
    Ok(taken == 1)
}

/// Give the lease up (a worker stopping), if `owner` holds it.
pub fn release(conn: &mut Conn, owner: &str) -> Result<()> {
    use flow_scheduler as q;
    on!(conn, |c| diesel::update(
        q::table.find(1i64).filter(q::owner.eq(owner))
    )
    .set((q::owner.eq(None::<String>), q::lease_until.eq(0i64)))
    .execute(c))?;
    Ok(())
}

/// Who holds the scheduler's lease, and until when.
pub fn holder(conn: &mut Conn) -> Result<Option<(Option<String>, i64)>> {
    use flow_scheduler as q;
    Ok(on!(conn, |c| q::table
        .find(1i64)
        .select((q::owner, q::lease_until))
        .first(c)
        .optional())?)
}

mod entries;
pub use entries::*;
