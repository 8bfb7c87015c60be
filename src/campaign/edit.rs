//! `mailsplit campaign edit`: a new content version (and/or subject,
//! sender) for a campaign that is a draft, scheduled or paused, checked
//! exactly as `campaign create` checks its content, and/or a new start
//! time (`--send-at`, which alone stores no content version). Workers
//! compose with the new version from the first message after `resume` or
//! the start (see the worker's flag refresh); the ledger records which
//! version each recipient got. A scheduled campaign takes edits until
//! [`START_MARGIN`] before its start, so every worker has seen the edit
//! when it begins.

use std::path::PathBuf;

use super::content::{self, ContentSource};
use super::{check_subject, CampaignError, Warning};
use crate::campaign::status::{CampaignStatus, Phase};
use crate::compose::{self, content::Compiled, content::Sources};
use crate::store::campaigns;
use crate::store::content::{self as stored, ContentKind, EditedCampaign, Track};
use crate::store::{now_ms, Campaign, Conn};

/// `campaign edit`'s options, as typed; `None`: unchanged.
#[derive(Debug, Clone, Default)]
pub struct EditRequest {
    pub name: String,
    pub subject: Option<String>,
    pub html: Option<PathBuf>,
    pub text: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    pub from: Option<String>,
    /// `--send-at`: RFC 3339 or `now`.
    pub send_at: Option<String>,
    /// `--track`: what to track from now on (`none` or empty: nothing).
    pub track: Option<String>,
}

/// How long before its start a scheduled campaign stops taking edits:
/// two of the workers' flag refreshes.
pub const START_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// An edit that was stored.
#[derive(Debug)]
pub struct Edited {
    pub name: String,
    /// The new content version; `None`: only the start time changed.
    pub version: Option<i64>,
    /// The new start time, when `--send-at` was given (`Some(None)`:
    /// none, send once enqueued).
    pub send_at: Option<Option<i64>>,
    /// The start moved earlier: jobs delayed for the old time should be
    /// made ready now (see `control::kick_delayed`).
    pub earlier: bool,
    pub warnings: Vec<Warning>,
}

/// The parts of the new version: kind, label, HTML and text, and the
/// warnings about its content.
struct Parts {
    kind: ContentKind,
    label: String,
    html: String,
    text: String,
    warnings: Vec<String>,
}

/// Refuse an edit in a state that takes none.
fn refuse_state(name: &str, state: Phase) -> Result<(), CampaignError> {
    let why = match state {
        Phase::Draft | Phase::Scheduled | Phase::Paused => return Ok(()),
        Phase::Sending | Phase::Enqueuing => format!(
            "it is {state}: pause it first (`mailsplit pause {name}`), edit, then `mailsplit resume {name}`"
        ),
        Phase::Done | Phase::Cancelled => {
            format!("it is {state}: there is nothing left to send an edit to")
        }
    };
    Err(CampaignError::NotEditable {
        name: name.to_string(),
        why,
    })
}

/// Check the edit like `campaign create` and store it: a new start time,
/// and the campaign's next content version unless only the start time
/// was given.
pub fn edit(conn: &mut Conn, req: &EditRequest) -> Result<Edited, CampaignError> {
    let c = campaigns::find(conn, &req.name)?;
    let counters = campaigns::counters(conn, c.id)?;
    refuse_state(&c.name, CampaignStatus::new(&c, &counters).state)?;
    let content = [
        req.subject.is_some(),
        req.html.is_some(),
        req.text.is_some(),
        req.markdown.is_some(),
        req.from.is_some(),
        req.track.is_some(),
    ]
    .contains(&true);
    if !content && req.send_at.is_none() {
        return Err(CampaignError::Bad(
            "nothing to change: give --subject, --html [--text], --text, --markdown, --from, --track or --send-at"
                .into(),
        ));
    }
    let now = now_ms();
    let send_at = req
        .send_at
        .as_deref()
        .map(|raw| crate::send_at::parse(raw, now))
        .transpose()?;
    let start_after = now + START_MARGIN.as_millis() as i64;
    let (version, warnings) = if content {
        let (v, w) = edit_content(conn, &c, req, start_after)?;
        (Some(v), w)
    } else {
        (None, Vec::new())
    };
    let mut earlier = false;
    if let Some(new) = send_at {
        let Some(old) = campaigns::reschedule(conn, c.id, new, start_after)? else {
            return Err(changed_meanwhile(conn, &req.name)?);
        };
        earlier = old.is_some_and(|old| new.is_none_or(|new| new < old));
    }
    Ok(Edited {
        name: c.name,
        version,
        send_at,
        earlier,
        warnings,
    })
}

/// The error for an edit the campaign stopped taking between the check
/// and the write (a `resume`, `enqueue`, `cancel` or its start).
fn changed_meanwhile(conn: &mut Conn, name: &str) -> Result<CampaignError, CampaignError> {
    let now = campaigns::find(conn, name)?;
    let counters = campaigns::counters(conn, now.id)?;
    refuse_state(&now.name, CampaignStatus::new(&now, &counters).state)?;
    Ok(CampaignError::NotEditable {
        name: now.name,
        why: "it changed while it was being edited (started, resumed or cancelled); try again"
            .into(),
    })
}

/// Store the new content version; returns it, with warnings about a new
/// sender.
fn edit_content(
    conn: &mut Conn,
    c: &Campaign,
    req: &EditRequest,
    start_after: i64,
) -> Result<(i64, Vec<Warning>), CampaignError> {
    let current = stored::latest(conn, c.id)?;
    let subject = req
        .subject
        .clone()
        .or_else(|| current.as_ref().map(|s| s.subject.clone()))
        .unwrap_or_else(|| c.subject.clone());
    check_subject(&subject)?;
    let from = match &req.from {
        Some(raw) => compose::parse_from(raw)?,
        None => compose::parse_from(&c.from_addr)?,
    };
    let parts = new_parts(&c.name, &c.template, &subject, req, current.as_ref())?;
    let track = match &req.track {
        Some(raw) => super::parse_track(raw)?,
        None => current
            .as_ref()
            .map(|s| Track::from_column(&s.track))
            .unwrap_or_default(),
    };
    let tracking = super::tracking_of(
        (parts.kind, &parts.label),
        (&parts.html, &parts.text),
        track,
        c.public_url.as_deref(),
    )?;
    let from_addr = from.to_string();
    let fields = EditedCampaign {
        subject: &subject,
        from_addr: &from_addr,
        template: &parts.label,
    };
    let stored = stored::edit(
        conn,
        c.id,
        &fields,
        parts.kind,
        (&parts.html, &parts.text),
        start_after,
        &tracking,
    )?;
    let Some(version) = stored else {
        return Err(changed_meanwhile(conn, &req.name)?);
    };
    let mut warnings: Vec<Warning> = parts.warnings.into_iter().map(Warning::Content).collect();
    if req.from.is_some() {
        warnings.extend(super::sender_warnings(
            conn,
            &from,
            c.return_path.as_deref(),
        )?);
    }
    Ok((version, warnings))
}

/// The content of the new version: from the files given (read, checked
/// and converted as `create` does), or the current parts with the new
/// subject checked against them.
fn new_parts(
    campaign: &str,
    label: &str,
    subject: &str,
    req: &EditRequest,
    current: Option<&stored::Content>,
) -> Result<Parts, CampaignError> {
    let source = match (&req.html, &req.markdown) {
        (Some(html), _) => Some(ContentSource::Html {
            html: html.clone(),
            text: req.text.clone(),
        }),
        (None, Some(md)) => Some(ContentSource::Markdown(md.clone())),
        (None, None) => None,
    };
    if let Some(source) = source {
        let p = content::prepare(campaign, subject, &source)?;
        return Ok(Parts {
            kind: p.kind,
            label: p.label,
            html: p.html,
            text: p.text,
            warnings: p.warnings,
        });
    }
    let (kind, html, text) = match current {
        Some(s) => (s.kind, s.html.clone(), s.text.clone()),
        None => (ContentKind::Builtin, String::new(), String::new()),
    };
    let text = match &req.text {
        Some(path) if kind == ContentKind::Html => {
            let (file, own) = content::read_file(path)?;
            check(campaign, subject, Some([("HTML part", &html), (&file, &own)]))?;
            own
        }
        Some(_) => {
            return Err(CampaignError::Bad(format!(
                "--text replaces the text part of --html content; this campaign's content is {kind}: give --html FILE --text FILE or --markdown FILE"
            )))
        }
        None => {
            let body = (kind != ContentKind::Builtin)
                .then_some([("HTML part", html.as_str()), ("text part", text.as_str())]);
            check(campaign, subject, body)?;
            text
        }
    };
    Ok(Parts {
        kind,
        label: label.to_string(),
        html,
        text,
        warnings: Vec::new(),
    })
}

/// The subject (and the body, when given) compile.
fn check(
    campaign: &str,
    subject: &str,
    body: Option<[(&str, &str); 2]>,
) -> Result<(), CampaignError> {
    Compiled::new(
        &Sources {
            subject: ("--subject", subject),
            body,
        },
        campaign,
    )
    .map_err(content::ContentError::from)?;
    Ok(())
}
