//! `mailsplit import FILE --list NAME`.

use std::io::IsTerminal;
use std::path::Path;

use crate::cli::args::Global;
use crate::cli::out::{error_line, outln};
use crate::import;

use super::{open_migrated, Result};

/// Rejected rows reported one by one before the rest are summarised.
const SHOWN_REJECTS: u32 = 1_000;

/// Import a CSV file into a list, with a spinner on a terminal.
pub fn import(g: &Global, file: &Path, list: &str, options: import::Options) -> Result {
    let mut conn = open_migrated(g)?;
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("importing");
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let started = std::time::Instant::now();
    let mut shown = 0u32;
    let summary = import::import_file(
        &mut conn,
        file,
        list,
        options,
        |r| {
            // Every rejected row is reported; a flood is summarised.
            if shown < SHOWN_REJECTS {
                bar.suspend(|| {
                    error_line(&format!(
                        "{}: line {}: {}",
                        file.display(),
                        r.line,
                        r.reason
                    ))
                });
            } else if shown == SHOWN_REJECTS {
                bar.suspend(|| error_line("(more rejected rows not shown)"));
            }
            shown += 1;
        },
        |rows| {
            bar.set_message(format!("importing: {rows} rows read"));
            bar.tick();
        },
    )?;
    bar.finish_and_clear();
    let removed = if options.sync {
        format!(" / removed {}", summary.removed)
    } else {
        String::new()
    };
    outln!(
        "list {list:?}: added {} / updated {} / unchanged {}{removed} / skipped {} / duplicates {} ({} rows read); kept unsubscribed: {}; {:.1} s",
        summary.added,
        summary.updated,
        summary.unchanged,
        summary.skipped,
        summary.duplicates,
        summary.read,
        summary.kept_unsubscribed,
        started.elapsed().as_secs_f64()
    )?;
    Ok(())
}
