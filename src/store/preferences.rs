//! What the preference centre (`/p/TOKEN`) reads and writes about one
//! recipient: their public lists' memberships and their name. Private
//! lists are never read nor changed here.

use diesel::prelude::*;

use super::schema::{list_members as m, lists as l, recipients as r};
use super::{now_ms, on, Conn, Result};

/// The ids of the public lists recipient `id` is a member of.
pub fn public_memberships(conn: &mut Conn, id: i64) -> Result<Vec<i64>> {
    Ok(on!(conn, |c| m::table
        .inner_join(l::table)
        .filter(m::recipient_id.eq(id))
        .filter(l::is_public.eq(true))
        .select(m::list_id)
        .load(c))?)
}

/// Make recipient `id` a member of public list `list_id`; false when it
/// was one (or the list is not public).
pub fn join(conn: &mut Conn, list_id: i64, id: i64) -> Result<bool> {
    let public: Option<bool> = on!(conn, |c| l::table
        .find(list_id)
        .select(l::is_public)
        .first(c)
        .optional())?;
    if public != Some(true) {
        return Ok(false);
    }
    let n = on!(conn, |c| diesel::insert_into(m::table)
        .values((m::list_id.eq(list_id), m::recipient_id.eq(id)))
        .on_conflict_do_nothing()
        .execute(c))?;
    Ok(n == 1)
}

/// Take recipient `id` off public list `list_id`; false when it was not a
/// member (or the list is not public).
pub fn leave(conn: &mut Conn, list_id: i64, id: i64) -> Result<bool> {
    let n = on!(conn, |c| diesel::delete(
        m::table
            .filter(m::list_id.eq(list_id))
            .filter(m::recipient_id.eq(id))
            .filter(m::list_id.eq_any(l::table.filter(l::is_public.eq(true)).select(l::id)))
    )
    .execute(c))?;
    Ok(n > 0)
}

/// Set recipient `id`'s name; false when it was already that.
pub fn rename(conn: &mut Conn, id: i64, name: &str) -> Result<bool> {
    let n = on!(conn, |c| diesel::update(
        r::table.find(id).filter(r::name.ne(name))
    )
    .set((r::name.eq(name), r::updated_at.eq(now_ms())))
    .execute(c))?;
    Ok(n > 0)
}
