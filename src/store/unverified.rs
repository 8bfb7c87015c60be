//! Reports that nobody can vouch for (see `crate::bounce`): recorded, one
//! row per message, so an operator sees them in `status` and the log, and
//! they change nobody.

use diesel::prelude::*;

use super::schema::unverified_reports as u;
use super::{now_ms, on, Conn, Result};

/// One unverified report to record.
#[derive(Debug, Clone)]
pub struct NewUnverified<'a> {
    /// Names the message (see `bounces::NewBounce::fingerprint`).
    pub fingerprint: &'a str,
    /// `dsn`, `arf`, `jmrp`, `ses` or `plain`.
    pub format: &'a str,
    /// The most serious kind it reported.
    pub kind: Option<&'a str>,
    /// How many addresses it named.
    pub addresses: i64,
    /// The first few of them, for the operator.
    pub sample: &'a str,
    /// Why it is not believed.
    pub why: &'a str,
}

/// Record one; false when this message was recorded before.
pub fn record(conn: &mut Conn, r: &NewUnverified) -> Result<bool> {
    let inserted = on!(conn, |c| diesel::insert_into(u::table)
        .values((
            u::fingerprint.eq(r.fingerprint),
            u::format.eq(r.format),
            u::kind.eq(r.kind),
            u::addresses.eq(r.addresses),
            u::sample.eq(super::clip_line(r.sample, 500)),
            u::why.eq(super::clip_line(r.why, 500)),
            u::received_at.eq(now_ms()),
        ))
        .on_conflict(u::fingerprint)
        .do_nothing()
        .execute(c))?;
    Ok(inserted == 1)
}

/// One recorded report, as `status` and tests read them back.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = u)]
pub struct Unverified {
    pub format: String,
    pub kind: Option<String>,
    pub addresses: i64,
    pub sample: String,
    pub why: String,
    pub received_at: i64,
}

/// How many there are, and the newest `limit` of them (newest first).
pub fn recent(conn: &mut Conn, limit: i64) -> Result<(i64, Vec<Unverified>)> {
    let total = on!(conn, |c| u::table.count().get_result::<i64>(c))?;
    let rows = on!(conn, |c| u::table
        .order(u::id.desc())
        .select(Unverified::as_select())
        .limit(limit)
        .load(c))?;
    Ok((total, rows))
}
