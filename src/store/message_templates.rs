//! Message templates (`mailsplit template …`): one row per name holding its
//! latest content version; `template edit` bumps the version in place, so a
//! message queued before an edit is sent with the content of its send time
//! (the worker reads the row when it sends).

use diesel::prelude::*;

use super::schema::message_templates as t;
use super::{now_ms, on, Conn, Result};

text_enum! {
    /// Which rules a template's messages follow: transactional mail ignores
    /// marketing unsubscribes; marketing mail honours them and carries
    /// List-Unsubscribe.
    pub enum Stream ("message stream (transactional, marketing)") {
        Transactional = "transactional",
        Marketing = "marketing",
    }
}

/// One stored template.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = t)]
pub struct MessageTemplate {
    pub id: i64,
    pub name: String,
    pub stream: Stream,
    pub version: i64,
    pub subject: String,
    pub from_addr: String,
    pub html: String,
    pub text_body: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// VERP return path (`local@domain`), if its messages have one.
    pub return_path: Option<String>,
    /// What its messages track (`opens`, `clicks`; see
    /// [`crate::store::content::Track`]).
    pub track: String,
    /// The base of its messages' tracking, preference and view links.
    pub public_url: Option<String>,
}

/// What a create or an edit stores.
#[derive(Debug, Clone)]
pub struct Content<'a> {
    pub stream: Stream,
    pub subject: &'a str,
    pub from_addr: &'a str,
    pub html: &'a str,
    pub text: &'a str,
    pub return_path: Option<&'a str>,
    pub track: &'a str,
    pub public_url: Option<&'a str>,
}

/// Store a new template; false when the name is taken.
pub fn create(conn: &mut Conn, name: &str, c: &Content) -> Result<bool> {
    let now = now_ms();
    let n = on!(conn, |x| diesel::insert_into(t::table)
        .values((
            t::name.eq(name),
            t::stream.eq(c.stream),
            t::version.eq(1i64),
            t::subject.eq(c.subject),
            t::from_addr.eq(c.from_addr),
            t::html.eq(c.html),
            t::text_body.eq(c.text),
            t::return_path.eq(c.return_path),
            t::track.eq(c.track),
            t::public_url.eq(c.public_url),
            t::created_at.eq(now),
            t::updated_at.eq(now),
        ))
        .on_conflict_do_nothing()
        .execute(x))?;
    Ok(n == 1)
}

/// Replace a template's content with a new version; its new version
/// number, or `None` when there is no such template.
pub fn edit(conn: &mut Conn, name: &str, c: &Content) -> Result<Option<i64>> {
    let n = on!(conn, |x| diesel::update(t::table.filter(t::name.eq(name)))
        .set((
            t::stream.eq(c.stream),
            t::version.eq(t::version + 1),
            t::subject.eq(c.subject),
            t::from_addr.eq(c.from_addr),
            t::html.eq(c.html),
            t::text_body.eq(c.text),
            t::return_path.eq(c.return_path),
            t::track.eq(c.track),
            t::public_url.eq(c.public_url),
            t::updated_at.eq(now_ms()),
        ))
        .execute(x))?;
    if n == 0 {
        return Ok(None);
    }
    Ok(find(conn, name)?.map(|t| t.version))
}

pub fn find(conn: &mut Conn, name: &str) -> Result<Option<MessageTemplate>> {
    Ok(on!(conn, |x| t::table
        .filter(t::name.eq(name))
        .select(MessageTemplate::as_select())
        .first(x)
        .optional())?)
}

pub fn by_id(conn: &mut Conn, id: i64) -> Result<Option<MessageTemplate>> {
    Ok(on!(conn, |x| t::table
        .find(id)
        .select(MessageTemplate::as_select())
        .first(x)
        .optional())?)
}

/// Every template, by name.
pub fn all(conn: &mut Conn) -> Result<Vec<MessageTemplate>> {
    Ok(on!(conn, |x| t::table
        .order(t::name.asc())
        .select(MessageTemplate::as_select())
        .load(x))?)
}

/// Remove a template; false when there was none. Messages keep its name.
pub fn remove(conn: &mut Conn, name: &str) -> Result<bool> {
    Ok(
        on!(conn, |x| diesel::delete(t::table.filter(t::name.eq(name)))
            .execute(x))?
            > 0,
    )
}
