//! `mailsplit webhook add | ls | rm`. A secret is printed once, by `add`
//! when it made one; `ls` never prints secrets (nor a password in a URL).

use crate::cli::args::{Global, WebhookCommand};
use crate::cli::out::outln;
use crate::webhooks;

use super::{open_migrated, open_read_only, Result};

/// `webhook add | ls | rm`.
pub fn webhook(g: &Global, cmd: WebhookCommand) -> Result {
    match cmd {
        WebhookCommand::Add {
            url,
            events,
            secret,
            allow_local,
        } => add(g, &url, &events, secret.as_deref(), allow_local),
        WebhookCommand::Ls => ls(g),
        WebhookCommand::Rm { id } => {
            webhooks::remove(&mut open_migrated(g)?, id)?;
            outln!("removed webhook {id}; nothing more is delivered to it")?;
            Ok(())
        }
    }
}

fn add(g: &Global, url: &str, events: &str, secret: Option<&str>, allow_local: bool) -> Result {
    let added = webhooks::add(&mut open_migrated(g)?, url, events, secret, allow_local)?;
    let kinds: Vec<&str> = added.events.iter().map(|k| k.as_str()).collect();
    outln!(
        "added webhook {}: {} gets {}",
        added.id,
        crate::redact::url(url),
        kinds.join(",")
    )?;
    if let Some(secret) = added.generated_secret {
        outln!("secret (shown only now; receivers check Mailsplit-Signature with it):")?;
        outln!("{secret}")?;
    }
    Ok(())
}

fn ls(g: &Global) -> Result {
    let hooks = webhooks::list(&mut open_read_only(g)?)?;
    if hooks.is_empty() {
        outln!("no webhooks; add one with `mailsplit webhook add URL --events sent,failed`")?;
    }
    for (h, pending) in hooks {
        outln!(
            "{}  {}  events {}  delivered {}  pending {}  failed {}",
            h.id,
            crate::redact::url(&h.url),
            h.events,
            h.delivered,
            pending,
            h.failed
        )?;
        if let (Some(error), Some(at)) = (&h.last_error, h.last_error_at) {
            let retrying = if pending > 0 && h.attempts > 0 {
                format!(", {} failed tries in a row", h.attempts)
            } else {
                String::new()
            };
            outln!(
                "    last error {}: {error}{retrying}",
                crate::clock::rfc3339(at, crate::clock::Precision::AsNeeded)
            )?;
        }
    }
    Ok(())
}
