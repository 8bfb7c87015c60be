//! `mailsplit template create|edit|ls|rm`: message templates, whose
//! content is checked and converted exactly as a campaign's (Jinja with the
//! render budgets, HTML/text/Markdown, CSS inlined; a bad template names
//! its file and line), and may also use `data.KEY`.

use crate::campaign::content::{prepare_for, ContentSource, Prepared};
use crate::compose::content::{Compiled, Sources};
use crate::compose::message::MESSAGE_VARIABLES;
use crate::compose::parse_from;
use crate::store::message_templates::{self as stored, Content, MessageTemplate, Stream};
use crate::store::Conn;

use super::MessageError;

/// What `template create` is given.
#[derive(Debug, Clone)]
pub struct NewTemplate {
    pub subject: String,
    pub from: String,
    /// `--html FILE [--text FILE]` or `--markdown FILE`.
    pub content: ContentSource,
    pub stream: Stream,
    /// VERP return path (`--return-path`): bounces name the message.
    pub return_path: Option<String>,
    /// `--track`: `opens`, `clicks`, `opens,clicks` or `none` (the
    /// default, as a campaign's).
    pub track: Option<String>,
    /// `--public-url`: where the pixel, the links and the recipient's
    /// preference and view pages point (`mailsplit serve`).
    pub public_url: Option<String>,
}

/// What `template edit` changes (the rest stays).
#[derive(Debug, Clone, Default)]
pub struct TemplateEdit {
    pub subject: Option<String>,
    pub from: Option<String>,
    pub content: Option<ContentSource>,
    pub stream: Option<Stream>,
    /// A new return path; `Some("")` removes it.
    pub return_path: Option<String>,
    /// New `--track` (`none` stops tracking).
    pub track: Option<String>,
    /// A new public URL; `Some("")` removes it.
    pub public_url: Option<String>,
}

/// A stored version, and what its author should hear (scripts).
#[derive(Debug)]
pub struct Saved {
    pub version: i64,
    pub warnings: Vec<String>,
}

fn prepare(name: &str, subject: &str, content: &ContentSource) -> Result<Prepared, MessageError> {
    if matches!(content, ContentSource::Template(_)) {
        return Err(MessageError::BadData(
            "a message template takes --html FILE [--text FILE] or --markdown FILE".into(),
        ));
    }
    Ok(prepare_for(name, subject, content, MESSAGE_VARIABLES)?)
}

/// `template create`.
pub fn create(conn: &mut Conn, name: &str, t: &NewTemplate) -> Result<Saved, MessageError> {
    check_name(name)?;
    parse_from(&t.from)?;
    let return_path = return_path(t.return_path.as_deref())?;
    let p = prepare(name, &t.subject, &t.content)?;
    let public_url = public_url(t.public_url.as_deref())?;
    let track = track(t.track.as_deref().unwrap_or(""), public_url.as_deref())?;
    let content = Content {
        stream: t.stream,
        subject: &p.subject,
        from_addr: t.from.trim(),
        html: &p.html,
        text: &p.text,
        return_path: return_path.as_deref(),
        track: &track,
        public_url: public_url.as_deref(),
    };
    if !stored::create(conn, name, &content)? {
        return Err(MessageError::TemplateExists(name.to_string()));
    }
    Ok(Saved {
        version: 1,
        warnings: p.warnings,
    })
}

/// `template edit`: a new version from the stored one and the changes.
pub fn edit(conn: &mut Conn, name: &str, e: &TemplateEdit) -> Result<Saved, MessageError> {
    let old = find(conn, name)?;
    let subject = e.subject.clone().unwrap_or_else(|| old.subject.clone());
    let from = e.from.clone().unwrap_or_else(|| old.from_addr.clone());
    parse_from(&from)?;
    let return_path = match e.return_path.as_deref() {
        Some(raw) => return_path(Some(raw))?,
        None => old.return_path.clone(),
    };
    let (html, text, warnings) = match &e.content {
        Some(c) => {
            let p = prepare(name, &subject, c)?;
            (p.html, p.text, p.warnings)
        }
        None => {
            // The stored parts with a new subject: checked together again.
            Compiled::with_vars(
                &Sources {
                    subject: ("--subject", &subject),
                    body: Some([("HTML part", &old.html), ("text part", &old.text_body)]),
                },
                name,
                MESSAGE_VARIABLES,
            )
            .map_err(crate::campaign::content::ContentError::from)?;
            (old.html.clone(), old.text_body.clone(), Vec::new())
        }
    };
    let public_url = match e.public_url.as_deref() {
        Some(raw) => public_url(Some(raw))?,
        None => old.public_url.clone(),
    };
    let track = track(
        e.track.as_deref().unwrap_or(&old.track),
        public_url.as_deref(),
    )?;
    let content = Content {
        stream: e.stream.unwrap_or(old.stream),
        subject: &subject,
        from_addr: from.trim(),
        html: &html,
        text: &text,
        return_path: return_path.as_deref(),
        track: &track,
        public_url: public_url.as_deref(),
    };
    let version = stored::edit(conn, name, &content)?
        .ok_or_else(|| MessageError::UnknownTemplate(name.to_string()))?;
    Ok(Saved { version, warnings })
}

/// `--return-path` checked as a campaign's (empty: none), canonical.
fn return_path(raw: Option<&str>) -> Result<Option<String>, MessageError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(raw) => Ok(Some(crate::compose::parse_return_path(raw)?)),
    }
}

/// `--public-url` checked as a campaign's (empty: none), canonical.
fn public_url(raw: Option<&str>) -> Result<Option<String>, MessageError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(raw) => crate::config::parse_public_url(raw)
            .map(Some)
            .map_err(|e| MessageError::Tracking(format!("bad --public-url: {e}"))),
    }
}

/// `--track` as stored (`opens,clicks`, `opens`, `clicks` or empty):
/// tracking needs the public URL its pixel and links point at.
fn track(raw: &str, public_url: Option<&str>) -> Result<String, MessageError> {
    let track =
        crate::campaign::parse_track(raw).map_err(|e| MessageError::Tracking(e.to_string()))?;
    if track.any() && public_url.is_none() {
        return Err(MessageError::Tracking(format!(
            "--track {track} needs --public-url (or MAILSPLIT_PUBLIC_URL): the pixel and the links point at `mailsplit serve` there"
        )));
    }
    Ok(track.to_string())
}

/// A template by name.
pub fn find(conn: &mut Conn, name: &str) -> Result<MessageTemplate, MessageError> {
    stored::find(conn, name)?.ok_or_else(|| MessageError::UnknownTemplate(name.to_string()))
}

/// `template ls`.
pub fn list(conn: &mut Conn) -> Result<Vec<MessageTemplate>, MessageError> {
    Ok(stored::all(conn)?)
}

/// `template rm`.
pub fn remove(conn: &mut Conn, name: &str) -> Result<(), MessageError> {
    if stored::remove(conn, name)? {
        Ok(())
    } else {
        Err(MessageError::UnknownTemplate(name.to_string()))
    }
}

/// Longest template name.
const MAX_NAME: usize = 100;

fn check_name(name: &str) -> Result<(), MessageError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(MessageError::BadData(format!(
            "template name {name:?}: use up to {MAX_NAME} letters, digits, '-', '_' or '.'"
        )))
    }
}
