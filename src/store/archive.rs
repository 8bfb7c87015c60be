//! Archived campaigns: a row per finished campaign the dashboard hides
//! (see `campaign::archive` for who may be archived).

use diesel::prelude::*;

use super::schema::campaign_archive as a;
use super::{on, Conn, Result};

/// Archive campaign `id` at `at` (ms); archiving it again keeps the first
/// time.
pub fn set(conn: &mut Conn, id: i64, at: i64) -> Result<()> {
    on!(conn, |c| diesel::insert_into(a::table)
        .values((a::campaign_id.eq(id), a::archived_at.eq(at)))
        .on_conflict(a::campaign_id)
        .do_nothing()
        .execute(c))?;
    Ok(())
}

/// Show campaign `id` on the dashboard again.
pub fn unset(conn: &mut Conn, id: i64) -> Result<()> {
    on!(conn, |c| diesel::delete(
        a::table.filter(a::campaign_id.eq(id))
    )
    .execute(c))?;
    Ok(())
}

/// The archived campaigns' ids (a few per finished campaign at most: the
/// table holds nothing else).
pub fn ids(conn: &mut Conn) -> Result<Vec<i64>> {
    Ok(on!(conn, |c| a::table.select(a::campaign_id).load(c))?)
}
