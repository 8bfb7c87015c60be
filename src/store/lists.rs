//! Lists as `mailsplit list` manages them: an overview, members taken off,
//! a list deleted. Recipients themselves, their history and their other
//! lists are never touched here.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

use super::recipients::RecipientStatus;
use super::schema::{campaigns, list_members as m, lists as l, recipients as r};
use super::{on, Conn, Result};

/// One line of `list ls`.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct ListSummary {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = BigInt)]
    pub members: i64,
    /// Members who may be mailed.
    #[diesel(sql_type = BigInt)]
    pub active: i64,
}

/// Every list with its member counts, by name.
pub fn overview(conn: &mut Conn) -> Result<Vec<ListSummary>> {
    let sql = format!(
        "SELECT l.name AS name, \
         (SELECT COUNT(*) FROM list_members m WHERE m.list_id = l.id) AS members, \
         (SELECT COUNT(*) FROM list_members m JOIN recipients r ON r.id = m.recipient_id \
          WHERE m.list_id = l.id AND r.status = '{}') AS active \
         FROM lists l ORDER BY l.name",
        RecipientStatus::Active.as_str()
    );
    Ok(on!(conn, |c| diesel::sql_query(&sql).load(c))?)
}

/// Take the recipient with mailbox `key` off the list; false when it was
/// not a member.
pub fn remove_member(conn: &mut Conn, list_id: i64, key: &str) -> Result<bool> {
    let removed = on!(conn, |c| diesel::delete(
        m::table
            .filter(m::list_id.eq(list_id))
            .filter(m::recipient_id.eq_any(r::table.filter(r::email_key.eq(key)).select(r::id)))
    )
    .execute(c))?;
    Ok(removed > 0)
}

/// Remove every member of the list, and the list itself unless a
/// campaign still names it (its history needs the row). Returns the
/// members removed and whether the list row went too.
pub fn delete(conn: &mut Conn, list_id: i64) -> Result<(u64, bool)> {
    conn.transaction(|conn| {
        let removed = on!(conn, |c| diesel::delete(
            m::table.filter(m::list_id.eq(list_id))
        )
        .execute(c))?;
        let named: i64 = on!(conn, |c| campaigns::table
            .filter(campaigns::list_id.eq(list_id))
            .count()
            .get_result(c))?;
        let gone =
            named == 0 && on!(conn, |c| diesel::delete(l::table.find(list_id)).execute(c))? == 1;
        Ok((removed as u64, gone))
    })
}
