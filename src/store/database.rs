//! Opening the database, as the commands do: the one door from the command
//! line to the [`store`](crate::store), so the CLI never names a store
//! module. Every stage function takes the [`Conn`] opened here.

pub use crate::store::{Conn, StoreError};

/// Open the database as it is (`migrate` creates the schema).
pub fn open(url: &str) -> Result<Conn, StoreError> {
    Conn::open(url)
}

/// Open, and fail with "run `mailsplit migrate`" when the schema is missing.
pub fn open_migrated(url: &str) -> Result<Conn, StoreError> {
    crate::store::open_migrated(url)
}

/// [`open_migrated`] for commands that only read.
pub fn open_read_only(url: &str) -> Result<Conn, StoreError> {
    crate::store::open_read_only(url)
}

/// Create or upgrade the schema; the names of the migrations applied, and
/// the SQLite file's path and mode when others may read it.
pub fn migrate(url: &str) -> Result<Migrated, StoreError> {
    let mut conn = open(url)?;
    let applied = conn.migrate()?;
    Ok(Migrated {
        applied,
        exposed: crate::store::exposed_sqlite_file(url),
    })
}

/// What [`migrate`] did.
pub struct Migrated {
    pub applied: Vec<String>,
    /// The SQLite file (recipients' personal data) other users may read:
    /// its path and mode.
    pub exposed: Option<(String, u32)>,
}
