//! `mailsplit template create|edit|ls|rm` and `mailsplit send`.

use crate::campaign::content::ContentSource;
use crate::cli::args::{Global, MessageCommand, SendArgs, TemplateCommand, TemplateContent};
use crate::cli::exit::UsageError;
use crate::cli::out::outln;
use crate::cli::resolve::queue_options;
use crate::messages::templates::{self, NewTemplate, TemplateEdit};
use crate::messages::{self, Queue, Submit};
use crate::store::message_templates::Stream;

use super::{open_migrated, open_read_only, Result};

fn content(c: TemplateContent) -> Option<ContentSource> {
    match (c.html, c.markdown) {
        (Some(html), _) => Some(ContentSource::Html { html, text: c.text }),
        (_, Some(md)) => Some(ContentSource::Markdown(md)),
        _ => None,
    }
}

fn stream(s: &str) -> Result<Stream> {
    s.parse()
        .map_err(|_| UsageError(format!("unknown stream {s:?}: transactional or marketing")).into())
}

/// `template create | edit | ls | rm`.
pub fn template(g: &Global, cmd: TemplateCommand) -> Result {
    match cmd {
        TemplateCommand::Create {
            name,
            content: c,
            subject,
            from,
            stream: s,
            return_path,
            track,
            public_url,
        } => {
            let content = content(c).ok_or_else(|| {
                UsageError("give the content: --html FILE [--text FILE] or --markdown FILE".into())
            })?;
            let t = NewTemplate {
                subject,
                from,
                content,
                stream: stream(&s)?,
                return_path,
                track,
                public_url,
            };
            warn(&templates::create(&mut open_migrated(g)?, &name, &t)?);
            outln!("created message template {name:?} ({s}, version 1)")?;
        }
        TemplateCommand::Edit {
            name,
            content: c,
            subject,
            from,
            stream: s,
            return_path,
            track,
            public_url,
        } => {
            let e = TemplateEdit {
                subject,
                from,
                content: content(c),
                stream: s.as_deref().map(stream).transpose()?,
                return_path,
                track,
                public_url,
            };
            let saved = templates::edit(&mut open_migrated(g)?, &name, &e)?;
            warn(&saved);
            outln!("message template {name:?} is now version {}", saved.version)?;
        }
        TemplateCommand::Ls { json } => ls(g, json)?,
        TemplateCommand::Rm { name } => {
            templates::remove(&mut open_migrated(g)?, &name)?;
            outln!("removed message template {name:?}")?;
        }
    }
    Ok(())
}

/// What the template's author should hear, on stderr.
fn warn(saved: &templates::Saved) {
    for w in &saved.warnings {
        eprintln!("warning: {w}");
    }
}

fn ls(g: &Global, json: bool) -> Result {
    let all = templates::list(&mut open_read_only(g)?)?;
    if all.is_empty() && !json {
        outln!("no message templates; add one with `mailsplit template create`")?;
    }
    for t in all {
        if json {
            let line = serde_json::json!({
                "name": t.name, "stream": t.stream.as_str(), "version": t.version,
                "subject": t.subject, "from": t.from_addr, "track": t.track,
                "public_url": t.public_url,
                "updated_at": crate::clock::rfc3339(t.updated_at, crate::clock::Precision::AsNeeded),
            });
            outln!("{line}")?;
        } else {
            outln!(
                "{}  {}  version {}  from {}  subject {:?}",
                t.name,
                t.stream,
                t.version,
                t.from_addr,
                t.subject
            )?;
        }
    }
    Ok(())
}

/// `send TEMPLATE --to ADDR [--data JSON] [--idempotency-key K]`.
pub fn send(g: &Global, a: SendArgs) -> Result {
    let data = a
        .data
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| UsageError(format!("--data is not JSON: {e}")))?;
    let (_, servers) = queue_options(g, 1)?;
    let queue = Queue {
        servers,
        tube: g.tube.clone(),
    };
    let submit = Submit {
        template: a.template,
        to: a.to,
        data,
        idempotency_key: a.idempotency_key,
    };
    let done = messages::submit(&mut open_migrated(g)?, &queue, submit)?;
    if a.json {
        outln!("{}", serde_json::to_string(&done)?)?;
    } else {
        outln!("message {} {}", done.id, done.status)?;
    }
    Ok(())
}

/// `message show ID [--json]`.
pub fn message(g: &Global, cmd: MessageCommand) -> Result {
    let MessageCommand::Show { id, json } = cmd;
    let m = messages::get(&mut open_read_only(g)?, id)?;
    if json {
        outln!("{}", serde_json::to_string(&m)?)?;
    } else {
        outln!(
            "message {}  {}  to {}  template {}",
            m.id,
            m.status,
            m.to,
            m.template
        )?;
        outln!(
            "created {}  sent {}",
            m.created_at,
            m.sent_at.as_deref().unwrap_or("-")
        )?;
        if let Some(reply) = &m.reply {
            outln!("reply: {reply}")?;
        }
    }
    Ok(())
}
