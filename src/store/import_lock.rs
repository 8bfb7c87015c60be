//! One import of a list at a time. Two imports of one list that overlap
//! would mix their generations (each `--sync` sweeps the other's marks),
//! so an import holds the list's lock from before its first row until it
//! has finished; a second one waits for it.
//!
//! - PostgreSQL: a session advisory lock on the import's own connection,
//!   keyed by the list's name (`hashtextextended`); the server drops it
//!   when the connection ends, so a killed import never leaves it held.
//! - SQLite: an exclusive `flock` on `<database file>-import-lock` (one
//!   lock for every list: SQLite writes one transaction at a time anyway);
//!   the kernel drops it when the process ends.

use diesel::sql_types::{Bool, Text};
use diesel::{QueryableByName, RunQueryDsl};

use super::{Conn, InnerMut, Result, StoreError};

/// A held import lock; give it back with [`release`] (dropping it is
/// enough on SQLite, and on PostgreSQL once the connection closes).
#[derive(Debug)]
pub enum ImportLock {
    /// The advisory lock's key text.
    Pg(String),
    File(std::fs::File),
    /// An in-memory SQLite database: no other process can share it.
    Unshared,
}

#[derive(QueryableByName)]
struct Got {
    #[diesel(sql_type = Bool)]
    ok: bool,
}

#[derive(QueryableByName)]
struct File {
    #[diesel(sql_type = Text)]
    file: String,
}

/// Take the import lock of list `name`; `on_wait` is called once if
/// another import holds it, before waiting for it.
pub fn acquire(conn: &mut Conn, name: &str, on_wait: &mut dyn FnMut()) -> Result<ImportLock> {
    match conn.inner_mut() {
        InnerMut::Pg(c) => {
            let key = format!("mailsplit import {name}");
            let got =
                diesel::sql_query("SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS ok")
                    .bind::<Text, _>(key.clone())
                    .get_result::<Got>(c)?;
            if !got.ok {
                on_wait();
                diesel::sql_query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
                    .bind::<Text, _>(key.clone())
                    .execute(c)?;
            }
            Ok(ImportLock::Pg(key))
        }
        InnerMut::Sqlite(c) => {
            let file =
                diesel::sql_query("SELECT file FROM pragma_database_list WHERE name = 'main'")
                    .get_result::<File>(c)?
                    .file;
            if file.is_empty() {
                return Ok(ImportLock::Unshared);
            }
            let path = format!("{file}-import-lock");
            let io = |source| StoreError::CreateFile {
                path: path.clone(),
                source,
            };
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io)?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    on_wait();
                    lock.lock().map_err(io)?;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
            Ok(ImportLock::File(lock))
        }
    }
}

/// Give the lock back (the SQLite file lock goes with the value).
pub fn release(conn: &mut Conn, lock: ImportLock) -> Result<()> {
    if let (ImportLock::Pg(key), InnerMut::Pg(c)) = (&lock, conn.inner_mut()) {
        diesel::sql_query("SELECT pg_advisory_unlock(hashtextextended($1, 0)) AS ok")
            .bind::<Text, _>(key.clone())
            .get_result::<Got>(c)?;
    }
    Ok(())
}
