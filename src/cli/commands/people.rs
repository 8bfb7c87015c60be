//! `mailsplit suppress add | import | ls | rm`: the suppression list.

use serde_json::json;

use crate::audience::suppress::{self, BAD_LINES_SHOWN};
use crate::cli::args::{Global, SuppressCommand};
use crate::cli::out::outln;
use crate::clock::{self, Precision};

use super::{open_migrated, open_read_only, Result};

/// `suppress add | import | ls | rm`.
pub fn suppress(g: &Global, cmd: SuppressCommand) -> Result {
    match cmd {
        SuppressCommand::Add { entries, reason } => {
            let added = suppress::add(&mut open_migrated(g)?, &entries, &reason)?;
            let already = entries.len().saturating_sub(added);
            outln!("suppressed {added} new entries ({already} already on the list): no campaign, flow or message is sent to them from now on")?;
        }
        SuppressCommand::Import { file, reason } => {
            let n = suppress::import(&mut open_migrated(g)?, &file, &reason)?;
            for (line, text) in &n.bad_lines {
                eprintln!(
                    "{}:{line}: not an address or @domain: {text:?}",
                    file.display()
                );
            }
            if n.bad > BAD_LINES_SHOWN as u64 {
                eprintln!("… and {} more bad lines", n.bad - BAD_LINES_SHOWN as u64);
            }
            outln!(
                "read {} entries: {} added, {} already on the list, {} bad lines skipped",
                n.read,
                n.added,
                n.already,
                n.bad
            )?;
        }
        SuppressCommand::Ls { json } => {
            let mut any = false;
            suppress::list(&mut open_read_only(g)?, |page| {
                for s in page {
                    any = true;
                    let at = clock::rfc3339(s.created_at, Precision::AsNeeded);
                    if json {
                        let row = json!({"entry": s.entry, "reason": s.reason, "created_at": at});
                        outln!("{row}")?;
                    } else {
                        outln!("{}  {}  {}", s.entry, at, s.reason)?;
                    }
                }
                Ok::<_, crate::cli::exit::CliError>(())
            })?;
            if !any && !json {
                outln!(
                    "the suppression list is empty; add with `mailsplit suppress add ADDR|@DOMAIN`"
                )?;
            }
        }
        SuppressCommand::Rm { entries } => {
            let gone = suppress::remove(&mut open_migrated(g)?, &entries)?;
            outln!(
                "removed {gone} of {} entries from the suppression list",
                entries.len()
            )?;
        }
    }
    Ok(())
}
