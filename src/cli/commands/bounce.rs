//! `mailsplit bounce [RECIPIENT] [--maildir DIR]`. Everything that could
//! succeed later (database down, schema not migrated, unreadable input)
//! exits 75 so Postfix keeps the message: a report is never lost.

use std::path::Path;
use std::process::ExitCode;

use crate::bounce::{self, Handled, Settings};
use crate::cli::args::{BounceArgs, Global};
use crate::cli::exit::EX_TEMPFAIL;
use crate::cli::out::{error_line, outln};
use crate::cli::resolve::bounce_settings;
use crate::redact;
use crate::tokens::Identity;

use super::{open_migrated, Conn, Result};

/// Record one report from stdin, or every message of a Maildir. The
/// message is read before the database is opened, so Postfix's write
/// never meets a closed pipe.
pub fn bounce(g: &Global, args: &BounceArgs) -> Result<ExitCode> {
    let settings = bounce_settings(args)?;
    let raw = match &args.maildir {
        Some(_) => None,
        None => match bounce::read_message(std::io::stdin().lock()) {
            Ok(raw) => Some(raw),
            Err(e) => {
                return tempfail(anyhow::Error::from(e).context("cannot read the message on stdin"))
            }
        },
    };
    let mut conn = match open_migrated(g) {
        Ok(conn) => conn,
        Err(e) => return tempfail(e.into()),
    };
    let identity = match bounce::identity(&mut conn) {
        Ok(i) => i,
        Err(e) => return tempfail(e.into()),
    };
    let done = match (raw, &args.maildir) {
        (Some(raw), _) => {
            let envelope = args.recipient.as_deref();
            bounce::handle(&mut conn, &identity, &raw, envelope, &settings)
                .map(|handled| show(&handled))
                .map_err(anyhow::Error::from)
        }
        (None, Some(dir)) => return maildir(&mut conn, &identity, dir, &settings),
        (None, None) => Ok(()),
    };
    match done {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => tempfail(e),
    }
}

/// Every message in DIR/new, then a summary line.
fn maildir(
    conn: &mut Conn,
    identity: &Identity,
    dir: &Path,
    settings: &Settings,
) -> Result<ExitCode> {
    let summary = bounce::maildir(conn, identity, dir, settings, |path, handled| {
        tracing::debug!(file = %path.display(), "handled");
        show(handled);
    });
    match summary {
        Ok(s) => {
            outln!(
                "{}: {} reports recorded, {} unverified, {} messages ignored",
                dir.display(),
                s.recorded,
                s.unverified,
                s.ignored
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => tempfail(e.into()),
    }
}

/// Say why, and ask Postfix to try again later.
fn tempfail(err: anyhow::Error) -> Result<ExitCode> {
    let shown = redact::text(&format!("{err:#}"));
    error_line(&format!(
        "mailsplit: error: {shown}; exit 75: try again later"
    ));
    Ok(ExitCode::from(EX_TEMPFAIL))
}

/// What one message turned into, in the log.
fn show(handled: &Handled) {
    match handled {
        Handled::Ignored(why) => tracing::info!("ignored: {why}"),
        Handled::Unverified(u) => tracing::warn!("{u}"),
        Handled::Message(m) => tracing::info!(
            message = m.message_id,
            recipient = %m.email,
            kind = %m.kind,
            status = m.status.as_deref().unwrap_or("-"),
            message_now = if m.bounced { "bounced" } else { "unchanged" },
            address_now = m.address_now.as_deref().unwrap_or("unchanged"),
            "recorded"
        ),
        Handled::Recorded(events) => {
            for e in events {
                tracing::info!(
                    recipient = %e.email,
                    campaign = ?e.campaign_id,
                    kind = %e.kind,
                    status = e.status.as_deref().unwrap_or("-"),
                    now = e.changed_to.map(|s| s.as_str()).unwrap_or("unchanged"),
                    "{}",
                    if e.new { "recorded" } else { "already recorded" }
                );
            }
        }
    }
}
