//! The worker fleet's heartbeat rows (table `workers`): each running worker
//! writes its own row every few seconds and deletes it when it exits
//! cleanly. Readers tell live from lost workers by how old `seen_at` is
//! (see `crate::worker::fleet`); nothing here needs the clocks of two machines to
//! agree beyond that bound.

use diesel::prelude::*;

use super::schema::workers as w;
use super::{on, Conn, Result};

text_enum! {
    /// What a worker said about itself in its last heartbeat.
    pub enum WorkerState ("worker state") {
        /// Reserving and sending.
        Running = "running",
        /// Told to stop (signal or deploy): finishing or handing back its
        /// jobs, then it exits and its row goes.
        Stopping = "stopping",
    }
}

/// One worker's heartbeat row.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Insertable)]
#[diesel(table_name = w)]
pub struct WorkerRow {
    /// `host/pid/started_at`: unique per process, readable in a listing.
    pub id: String,
    pub host: String,
    pub pid: i64,
    /// mailsplit's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// Hex prefix of the SHA-256 of the running executable.
    pub binary_hash: String,
    pub binary_size: i64,
    /// Modification time of the executable, ms since the epoch.
    pub binary_mtime: i64,
    /// `HOST:PORT` of the relay it sends to.
    pub relay: String,
    pub concurrency: i64,
    pub state: WorkerState,
    pub started_at: i64,
    pub seen_at: i64,
    /// Messages this process recorded as sent.
    pub sent: i64,
    /// Messages sent per second between its last two heartbeats.
    pub rate: f64,
    /// The named tube it reserves from (`--tube`).
    pub tube: String,
    /// Jobs of other databases it met in that tube (and moved to their
    /// own tubes), and those databases' ids, comma-separated.
    pub foreign_jobs: i64,
    pub foreign_databases: String,
}

/// Write a heartbeat: the whole row the first time (or after someone
/// removed it), then its moving parts.
pub fn beat(conn: &mut Conn, row: &WorkerRow) -> Result<()> {
    on!(conn, |c| diesel::insert_into(w::table)
        .values(row)
        .on_conflict(w::id)
        .do_update()
        .set((
            w::state.eq(row.state),
            w::seen_at.eq(row.seen_at),
            w::sent.eq(row.sent),
            w::rate.eq(row.rate),
            w::foreign_jobs.eq(row.foreign_jobs),
            w::foreign_databases.eq(&row.foreign_databases),
        ))
        .execute(c))?;
    Ok(())
}

/// A worker leaves the fleet (clean exit). False if its row was gone.
pub fn remove(conn: &mut Conn, id: &str) -> Result<bool> {
    Ok(on!(conn, |c| diesel::delete(w::table.find(id)).execute(c))? > 0)
}

/// Every row, grouped by host, oldest process first.
pub fn list(conn: &mut Conn) -> Result<Vec<WorkerRow>> {
    Ok(on!(conn, |c| w::table
        .order((w::host, w::started_at, w::pid))
        .select(WorkerRow::as_select())
        .load(c))?)
}

/// Delete the rows of workers silent since before `cutoff` (ms): lost so
/// long ago that nobody needs to see them any more. Returns how many.
pub fn forget_silent_since(conn: &mut Conn, cutoff: i64) -> Result<usize> {
    Ok(on!(conn, |c| diesel::delete(
        w::table.filter(w::seen_at.lt(cutoff))
    )
    .execute(c))?)
}
