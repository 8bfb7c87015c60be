//! Admin login sessions (`serve`'s session cookies): a cookie is let in
//! only while its row exists, so `POST /logout` ends a session for good,
//! whoever kept a copy of the cookie. Rows are keyed by a hash of the
//! cookie's nonce and name the admin token they were made under (its
//! fingerprint), so a change of token ends every older session.

use diesel::prelude::*;

use super::schema::admin_sessions as s;
use super::{on, Conn, Result};

/// Record a new session, and forget the expired ones (`now_ms`, ms).
pub fn create(
    conn: &mut Conn,
    id: &str,
    token_fp: &str,
    now_ms: i64,
    expires_at_ms: i64,
) -> Result<()> {
    on!(conn, |c| diesel::delete(
        s::table.filter(s::expires_at.le(now_ms))
    )
    .execute(c))?;
    on!(conn, |c| diesel::insert_into(s::table)
        .values((
            s::id.eq(id),
            s::token_fp.eq(token_fp),
            s::created_at.eq(now_ms),
            s::expires_at.eq(expires_at_ms),
        ))
        .execute(c))?;
    Ok(())
}

/// Whether session `id`, made under the token `token_fp`, is still open.
pub fn alive(conn: &mut Conn, id: &str, token_fp: &str, now_ms: i64) -> Result<bool> {
    let found: Option<String> = on!(conn, |c| s::table
        .find(id)
        .filter(s::token_fp.eq(token_fp))
        .filter(s::expires_at.gt(now_ms))
        .select(s::id)
        .first(c)
        .optional())?;
    Ok(found.is_some())
}

/// End session `id`; false when it was not open.
pub fn end(conn: &mut Conn, id: &str) -> Result<bool> {
    Ok(on!(conn, |c| diesel::delete(s::table.find(id)).execute(c))? > 0)
}

/// End every session not made under the token `token_fp`; how many.
pub fn end_other_tokens(conn: &mut Conn, token_fp: &str) -> Result<usize> {
    Ok(on!(conn, |c| diesel::delete(
        s::table.filter(s::token_fp.ne(token_fp))
    )
    .execute(c))?)
}
