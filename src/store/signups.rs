//! Sign-ups to double-opt-in lists waiting for their confirmation: made by
//! `/subscribe`, confirmed once by `/confirm/TOKEN`'s POST, deleted after
//! [`KEEP_MS`]. Counting an address's rows of the last day is how the
//! confirmation mails to one address are capped.

use diesel::prelude::*;

use super::schema::signups as s;
use super::{on, Conn, Result};

/// How long a sign-up (and its link) stays valid: 7 days.
pub const KEEP_MS: i64 = 7 * 24 * 3600 * 1000;

/// One sign-up.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct Signup {
    pub id: i64,
    pub email: String,
    pub email_key: String,
    pub name: String,
    /// The lists' ids, comma-separated.
    pub list_ids: String,
    pub created_at: i64,
    pub confirmed_at: Option<i64>,
}

impl Signup {
    pub fn lists(&self) -> Vec<i64> {
        self.list_ids
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect()
    }
}

/// Sign-ups of mailbox `key` made since `since` (ms).
pub fn count_since(conn: &mut Conn, key: &str, since: i64) -> Result<i64> {
    Ok(on!(conn, |c| s::table
        .filter(s::email_key.eq(key))
        .filter(s::created_at.ge(since))
        .count()
        .get_result(c))?)
}

/// Store a sign-up; its id.
pub fn insert(
    conn: &mut Conn,
    email: &str,
    key: &str,
    name: &str,
    lists: &[i64],
    now: i64,
) -> Result<i64> {
    let ids = lists
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    Ok(on!(conn, |c| diesel::insert_into(s::table)
        .values((
            s::email.eq(email),
            s::email_key.eq(key),
            s::name.eq(name),
            s::list_ids.eq(&ids),
            s::created_at.eq(now),
        ))
        .returning(s::id)
        .get_result(c))?)
}

pub fn find(conn: &mut Conn, id: i64) -> Result<Option<Signup>> {
    Ok(on!(conn, |c| s::table.find(id).first(c).optional())?)
}

/// Mark sign-up `id` confirmed; false when it already was (so a second
/// POST changes nothing).
pub fn mark_confirmed(conn: &mut Conn, id: i64, now: i64) -> Result<bool> {
    let n = on!(conn, |c| diesel::update(
        s::table.find(id).filter(s::confirmed_at.is_null())
    )
    .set(s::confirmed_at.eq(now))
    .execute(c))?;
    Ok(n == 1)
}

/// Delete sign-ups made before `before`; how many.
pub fn expire(conn: &mut Conn, before: i64) -> Result<u64> {
    Ok(on!(conn, |c| diesel::delete(
        s::table.filter(s::created_at.lt(before))
    )
    .execute(c))? as u64)
}
