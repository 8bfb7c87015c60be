//! `mailsplit suppress add | import | ls | rm`: the suppression list;
//! `mailsplit subscriber show | export | forget`: what is held about one
//! person, and its erasure.

use serde_json::json;

use crate::audience::subscriber::{self, Afterwards};
use crate::audience::suppress::{self, BAD_LINES_SHOWN};
use crate::cli::args::{Global, SubscriberCommand, SuppressCommand};
use crate::cli::exit::{CliError, UsageError};
use crate::cli::out::error_line;
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

/// `subscriber show | export | forget`.
pub fn subscriber(g: &Global, cmd: SubscriberCommand) -> Result {
    match cmd {
        SubscriberCommand::Forget { email, yes } => forget(g, &email, yes)?,
        SubscriberCommand::Export { email } => {
            let all = subscriber::export(&mut open_read_only(g)?, &email)?;
            outln!("{}", serde_json::to_string_pretty(&all)?)?;
        }
        SubscriberCommand::Show { email, json } => {
            let all = subscriber::export(&mut open_read_only(g)?, &email)?;
            let r = &all["recipient"];
            if json {
                let mut shown = r.clone();
                if let Some(o) = shown.as_object_mut() {
                    o.remove("id");
                    o.insert("lists".into(), all["lists"].clone());
                    o.insert("suppressed".into(), all["suppressed"].clone());
                }
                outln!("{shown}")?;
                return Ok(());
            }
            let count = |k: &str| all[k].as_array().map_or(0, Vec::len);
            let lists: Vec<&str> = all["lists"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            outln!("email       {}", all["email"].as_str().unwrap_or_default())?;
            if r.is_null() {
                outln!("recipient   none (only messages or a suppression entry)")?;
            } else {
                outln!("name        {}", r["name"].as_str().unwrap_or_default())?;
                outln!("status      {}", r["status"].as_str().unwrap_or_default())?;
                outln!("attributes  {}", r["attributes"])?;
            }
            outln!("lists       {}", lists.join(", "))?;
            outln!("suppressed  {}", all["suppressed"].as_str().unwrap_or("no"))?;
            outln!(
                "rows        {} deliveries, {} engagement, {} bounces, {} webhook events, {} messages",
                count("deliveries"),
                count("engagement"),
                count("bounces"),
                count("webhook_events"),
                count("messages")
            )?;
            outln!("(`mailsplit subscriber export EMAIL` prints every row as JSON)")?;
        }
    }
    Ok(())
}

/// `subscriber forget EMAIL [--yes]`.
fn forget(g: &Global, email: &str, yes: bool) -> Result {
    if !yes && !confirmed(email)? {
        return Err(CliError::Usage(UsageError(format!(
            "nothing erased: `subscriber forget` cannot be undone; run it again with --yes to erase {email:?}"
        ))));
    }
    let done = subscriber::forget(&mut open_migrated(g)?, email)?;
    let e = &done.erased;
    if e.recipients == 0 && e.messages == 0 && e.signups == 0 && !e.suppressed {
        outln!("nothing was held about {}; the address is blocked all the same: no import, API call or flow adds it", done.key)?;
    } else {
        outln!(
            "forgot {}: {} recipient rows, {} list memberships, {} engagement rows, {} sign-ups, {} webhook events erased; the address taken out of {} deliveries, {} bounces, {} messages, {} flow entries and {} other texts{}",
            done.key,
            e.recipients,
            e.memberships,
            e.engagement,
            e.signups,
            e.webhook_events,
            e.deliveries,
            e.bounces,
            e.messages,
            e.flow_entries,
            e.texts,
            if e.suppressed { "; its suppression entry too (kept as part of the block)" } else { "" }
        )?;
        outln!("only a keyed hash of the address stays: no import, API call or flow adds it again; the person can come back by confirming a double-opt-in sign-up")?;
    }
    match done.afterwards {
        Afterwards::Clean => {}
        Afterwards::LogBusy => error_line(
            "mailsplit: note: another process was reading the database, so its write-ahead log (mailsplit.db-wal) still holds the erased rows until the next checkpoint; run the command again later to flush it",
        ),
        Afterwards::DeadTuples => error_line(
            "mailsplit: note: PostgreSQL keeps old row versions until VACUUM reuses their space, and in its WAL and backups; see docs/operations.md, \"Forgetting a person\"",
        ),
    }
    Ok(())
}

/// Ask on a terminal; `false` when stdin is not one.
fn confirmed(email: &str) -> Result<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("erase everything held about {email:?}? This cannot be undone. Type yes: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let read = std::io::stdin().lock().read_line(&mut answer);
    Ok(read.is_ok() && answer.trim() == "yes")
}
