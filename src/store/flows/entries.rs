//! The entries as the scheduler moves them: the due ones (a range read of
//! the `due_at` index), what decides whether each may get its step, and
//! its moves (on, out, later).

use super::*;

/// One due entry with what the scheduler needs to decide on it.
#[derive(Debug, Clone, Queryable)]
pub struct Due {
    pub id: i64,
    pub flow_id: i64,
    pub recipient_id: i64,
    pub entry_key: String,
    pub row_data: String,
    pub next_step: i64,
    pub entered_at: i64,
    /// SQL trigger: when a poll last returned the entry.
    pub seen_at: i64,
    pub email: String,
    pub name: String,
    pub status: RecipientStatus,
}

/// Up to `limit` entries due by `now`, oldest due first, of active
/// flows: a range read of the `due_at` index.
pub fn due(conn: &mut Conn, now: i64, limit: i64) -> Result<Vec<Due>> {
    Ok(on!(conn, |c| e::table
        .inner_join(f::table.on(f::id.eq(e::flow_id)))
        .inner_join(r::table.on(r::id.eq(e::recipient_id)))
        .filter(e::due_at.le(now))
        .filter(f::state.eq(FlowState::Active))
        .order(e::due_at)
        .limit(limit)
        .select((
            e::id,
            e::flow_id,
            e::recipient_id,
            e::entry_key,
            e::row_data,
            e::next_step,
            e::entered_at,
            e::seen_at,
            r::email,
            r::name,
            r::status,
        ))
        .load(c))?)
}

/// Which of `recipients` are still members of list `list_id`. On SQLite
/// one fixed text, prepared once per connection (diesel's `eq_any` is
/// one `?` per recipient, parsed anew for every batch).
pub fn members_among(
    conn: &mut Conn,
    list_id: i64,
    recipients: &[i64],
) -> Result<std::collections::HashSet<i64>> {
    #[derive(QueryableByName)]
    struct Member {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        recipient_id: i64,
    }
    Ok(match conn.inner_mut() {
        crate::store::InnerMut::Sqlite(c) => {
            let json = crate::store::prepared::ids_json(recipients);
            let found: Vec<Member> = crate::store::prepared::Prepared::new(
                "SELECT recipient_id FROM list_members \
                 WHERE list_id = ? AND recipient_id IN (SELECT value FROM json_each(?))",
                vec![Bind::Int(list_id), Bind::Json(&json)],
            )
            .load(c)?;
            found.into_iter().map(|m| m.recipient_id).collect()
        }
        crate::store::InnerMut::Pg(c) => lm::table
            .filter(lm::list_id.eq(list_id))
            .filter(lm::recipient_id.eq_any(recipients))
            .select(lm::recipient_id)
            .load::<i64>(c)?
            .into_iter()
            .collect(),
    })
}

/// Which of the recipients ever complained: the messages' own read.
pub use crate::store::messages::complained_among;

/// Move entry `id` from step `from` to `to`, due at `due_at` (none: the
/// entry is done). False when another scheduler moved it first.
pub fn advance(conn: &mut Conn, id: i64, from: i64, to: i64, due_at: Option<i64>) -> Result<bool> {
    let state = match due_at {
        Some(_) => EntryState::Active,
        None => EntryState::Done,
    };
    // Prepared once per connection (see `super::prepared`): the scheduler
    // moves every entry of a batch with it, and diesel would parse and
    // plan each UPDATE anew.
    const ADVANCE: &str = "UPDATE flow_entries SET next_step = ?, due_at = ?, state = ?, \
         updated_at = ? WHERE id = ? AND next_step = ? AND state = ?";
    let n = on!(conn, |c| crate::store::prepared::Prepared::new(
        ADVANCE,
        vec![
            Bind::Int(to),
            Bind::OptInt(due_at),
            Bind::Text(state.as_str()),
            Bind::Int(now_ms()),
            Bind::Int(id),
            Bind::Int(from),
            Bind::Text(EntryState::Active.as_str()),
        ],
    )
    .execute(c))?;
    Ok(n == 1)
}

/// One entry's move for [`advance_many`]: entry, from step, to step, due
/// at (none: the entry is done).
pub type Move = (i64, i64, i64, Option<i64>);

/// `json_extract`, not `->>` (SQLite 3.38; Debian 11 has 3.34). The
/// planner reads the array and finds each entry by its primary key.
const ADVANCE_SQLITE: &str = "UPDATE flow_entries SET \
       next_step = json_extract(v.value, '$[2]'), due_at = json_extract(v.value, '$[3]'), \
       state = json_extract(v.value, '$[4]'), updated_at = ? \
     FROM json_each(?) AS v \
     WHERE flow_entries.id = json_extract(v.value, '$[0]') \
       AND flow_entries.next_step = json_extract(v.value, '$[1]') AND flow_entries.state = ?";

const ADVANCE_PG: &str = "UPDATE flow_entries SET next_step = u.to_step, due_at = u.due_at, \
       state = u.state, updated_at = $1 \
     FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[]) \
       AS u(id, from_step, to_step, due_at, state) \
     WHERE flow_entries.id = u.id AND flow_entries.next_step = u.from_step \
       AND flow_entries.state = $7";

/// [`advance`] for a batch of entries, in one statement (one per entry
/// was most of the scheduler's last transaction): how many moved.
pub fn advance_many(conn: &mut Conn, moves: &[Move]) -> Result<usize> {
    use diesel::sql_types::{Array, BigInt, Nullable, Text};
    if moves.is_empty() {
        return Ok(0);
    }
    let state = |due: Option<i64>| match due {
        Some(_) => EntryState::Active.as_str(),
        None => EntryState::Done.as_str(),
    };
    let now = now_ms();
    let active = EntryState::Active.as_str();
    let n = match conn.inner_mut() {
        crate::store::InnerMut::Sqlite(c) => {
            let rows: Vec<_> = moves
                .iter()
                .map(|&(id, from, to, due)| (id, from, to, due, state(due)))
                .collect();
            let json = serde_json::to_string(&rows)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            crate::store::prepared::Prepared::new(
                ADVANCE_SQLITE,
                vec![Bind::Int(now), Bind::Json(&json), Bind::Text(active)],
            )
            .execute(c)?
        }
        crate::store::InnerMut::Pg(c) => {
            let column = |f: fn(&Move) -> i64| moves.iter().map(f).collect::<Vec<i64>>();
            diesel::sql_query(ADVANCE_PG)
                .bind::<BigInt, _>(now)
                .bind::<Array<BigInt>, _>(column(|m| m.0))
                .bind::<Array<BigInt>, _>(column(|m| m.1))
                .bind::<Array<BigInt>, _>(column(|m| m.2))
                .bind::<Array<Nullable<BigInt>>, _>(moves.iter().map(|m| m.3).collect::<Vec<_>>())
                .bind::<Array<Text>, _>(moves.iter().map(|m| state(m.3)).collect::<Vec<_>>())
                .bind::<Text, _>(active)
                .execute(c)?
        }
    };
    Ok(n)
}

/// Entry `id` leaves before step `at` for `reason`.
pub fn leave(conn: &mut Conn, id: i64, at: i64, reason: &str) -> Result<bool> {
    let n = on!(conn, |c| diesel::update(
        e::table
            .find(id)
            .filter(e::next_step.eq(at))
            .filter(e::state.eq(EntryState::Active))
    )
    .set((
        e::due_at.eq(None::<i64>),
        e::state.eq(EntryState::Left),
        e::left_reason.eq(Some(reason)),
        e::updated_at.eq(now_ms()),
    ))
    .execute(c))?;
    Ok(n == 1)
}

/// Why a member whose recipient row says `status` (and who `complained`
/// or not) leaves a flow, if they do.
pub fn leave_reason(status: RecipientStatus, complained: bool) -> Option<&'static str> {
    match status {
        _ if complained => Some("complained"),
        RecipientStatus::Bounced => Some("bounced"),
        RecipientStatus::Unsubscribed => Some("unsubscribed"),
        RecipientStatus::Active => None,
    }
}

/// Try entry `id`'s step `at` again at `due_at` (its send could not be
/// queued now).
pub fn postpone(conn: &mut Conn, id: i64, at: i64, due_at: i64) -> Result<()> {
    on!(conn, |c| diesel::update(
        e::table
            .find(id)
            .filter(e::next_step.eq(at))
            .filter(e::state.eq(EntryState::Active))
    )
    .set(e::due_at.eq(Some(due_at)))
    .execute(c))?;
    Ok(())
}
