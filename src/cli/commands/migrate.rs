//! `mailsplit migrate`.

use crate::cli::args::Global;
use crate::cli::out::{error_line, outln};
use crate::store;

use super::{open, Result};

/// Create or upgrade the schema, and say what was applied.
pub fn migrate(g: &Global) -> Result {
    let mut conn = open(g)?;
    let applied = conn.migrate()?;
    if let Some((path, mode)) = store::exposed_sqlite_file(&g.database_url) {
        error_line(&format!(
            "mailsplit: note: {path} (recipients' personal data) is readable by other users (mode {mode:o}); `chmod 600 {path}` makes it private"
        ));
    }
    if applied.is_empty() {
        outln!("schema is up to date")?;
    } else {
        outln!(
            "applied {} migration(s): {}",
            applied.len(),
            applied.join(", ")
        )?;
    }
    Ok(())
}
