//! `mailsplit migrate`.

use crate::cli::args::Global;
use crate::cli::out::{error_line, outln};
use crate::store::database;

use super::Result;

/// Create or upgrade the schema, and say what was applied.
pub fn migrate(g: &Global) -> Result {
    let migrated = database::migrate(&g.database_url)?;
    let applied = migrated.applied;
    if let Some((path, mode)) = migrated.exposed {
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
