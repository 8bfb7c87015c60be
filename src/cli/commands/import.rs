//! `mailsplit import FILE --list NAME` and `import --list NAME --from-sql
//! QUERY --source URL`.

use std::io::IsTerminal;

use crate::audience::import::{self, Rejected, Summary};
use crate::audience::source::{self, SqlSource};
use crate::cli::args::{Global, ImportArgs};
use crate::cli::exit::UsageError;
use crate::cli::out::{error_line, outln};

use super::{open_migrated, Result};

/// Rejected rows reported one by one before the rest are summarised.
const SHOWN_REJECTS: u32 = 1_000;

/// Import a CSV file or a query's rows into a list, with a spinner on a
/// terminal.
pub fn import(g: &Global, args: &ImportArgs) -> Result {
    let options = import::Options {
        sync: args.sync,
        resubscribe: args.resubscribe,
        allow_empty: args.allow_empty,
    };
    // The source first: a bad query is reported before anything changes.
    let mut source = open_source(args)?;
    let mut conn = open_migrated(g)?;
    let bar = spinner();
    let started = std::time::Instant::now();
    let on_reject = reject_reporter(&bar, args);
    let on_progress = |rows: u64| {
        bar.set_message(format!("importing: {rows} rows read"));
        bar.tick();
    };
    let list = &args.list;
    let mut on_wait = || {
        bar.suspend(|| {
            error_line(&format!(
                "waiting for another import of list {list:?} to finish (one import of a list at a time)"
            ))
        })
    };
    let on_wait = &mut on_wait;
    let summary = match (&mut source, &args.file) {
        (Some(source), _) => import::import_sql(
            &mut conn,
            source,
            list,
            options,
            on_reject,
            on_progress,
            on_wait,
        )?,
        (None, Some(file)) => import::import_file(
            &mut conn,
            file,
            list,
            options,
            on_reject,
            on_progress,
            on_wait,
        )?,
        (None, None) => return Err(UsageError("name a CSV file or --from-sql QUERY".into()).into()),
    };
    bar.finish_and_clear();
    print_summary(list, &summary, options, started)
}

/// The SQL source of `--from-sql`, opened and its query checked.
fn open_source(args: &ImportArgs) -> Result<Option<SqlSource>> {
    match (&args.from_sql, &args.source) {
        (Some(query), Some(url)) => {
            warn_if_password_shows(url);
            let options = source::Options {
                allow_privileged: args.allow_privileged_source,
                max_row_bytes: import::MAX_RECORD_BYTES,
            };
            Ok(Some(
                SqlSource::open(url, query, options).map_err(import::ImportError::from)?,
            ))
        }
        (Some(_), None) => {
            Err(UsageError("--from-sql needs --source URL (or MAILSPLIT_SOURCE_URL)".into()).into())
        }
        (None, _) => Ok(None),
    }
}

/// A spinner on a terminal, nothing otherwise.
/// Every rejected row is reported above the spinner, by line (a file) or
/// row (a query); a flood is summarised.
fn reject_reporter<'a>(
    bar: &'a indicatif::ProgressBar,
    args: &ImportArgs,
) -> impl FnMut(&Rejected) + 'a {
    let label = match &args.file {
        Some(file) => format!("{}: line", file.display()),
        None => "query: row".to_string(),
    };
    let mut shown = 0u32;
    move |r: &Rejected| {
        if shown < SHOWN_REJECTS {
            bar.suspend(|| error_line(&format!("{label} {}: {}", r.line, r.reason)));
        } else if shown == SHOWN_REJECTS {
            bar.suspend(|| error_line("(more rejected rows not shown)"));
        }
        shown += 1;
    }
}

fn spinner() -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("importing");
        bar
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// The variable `--source` may come from instead of the command line.
const SOURCE_VARIABLE: &str = "MAILSPLIT_SOURCE_URL";

/// A password typed in `--source` is in this process's command line,
/// which every user of the machine can read (`ps`) while it runs: say so
/// and how to avoid it (the variable), without showing the password.
fn warn_if_password_shows(url: &str) {
    let from_variable = std::env::var(SOURCE_VARIABLE).is_ok_and(|v| v == url);
    if !from_variable && crate::redact::has_secret(url) {
        error_line(&format!(
            "mailsplit: warning: the --source URL holds a password, which every user of this machine can read in `ps` while the import runs; set {SOURCE_VARIABLE} instead"
        ));
    }
}

fn print_summary(
    list: &str,
    summary: &Summary,
    options: import::Options,
    started: std::time::Instant,
) -> Result {
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
    if summary.forgotten > 0 {
        outln!(
            "skipped {} rows of addresses erased at their owner's request (`subscriber forget`): only the person can come back, by confirming a double-opt-in sign-up",
            summary.forgotten
        )?;
    }
    Ok(())
}
