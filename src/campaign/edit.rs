//! `mailsplit campaign edit`: a new content version (and/or subject,
//! sender) for a campaign that is a draft or paused, checked exactly as
//! `campaign create` checks its content. Workers compose with the new
//! version from the first message after `resume` (see the worker's flag
//! refresh); the ledger records which version each recipient got.

use std::path::PathBuf;

use super::content::{self, ContentSource};
use super::{check_subject, CampaignError, Warning};
use crate::compose::{self, content::Compiled, content::Sources};
use crate::status::{CampaignStatus, Phase};
use crate::store::campaigns;
use crate::store::content::{self as stored, ContentKind, EditedCampaign, Track};
use crate::store::{dkim_keys, Conn};

/// `campaign edit`'s options, as typed; `None`: unchanged.
#[derive(Debug, Clone, Default)]
pub struct EditRequest {
    pub name: String,
    pub subject: Option<String>,
    pub html: Option<PathBuf>,
    pub text: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    pub from: Option<String>,
    /// `--track`: what to track from now on (`none` or empty: nothing).
    pub track: Option<String>,
}

/// An edit that was stored.
#[derive(Debug)]
pub struct Edited {
    pub name: String,
    /// The new content version.
    pub version: i64,
    pub warnings: Vec<Warning>,
}

/// The parts of the new version: kind, label, HTML and text.
struct Parts {
    kind: ContentKind,
    label: String,
    html: String,
    text: String,
}

/// Refuse an edit in a state that takes none.
fn refuse_state(name: &str, state: Phase) -> Result<(), CampaignError> {
    let why = match state {
        Phase::Draft | Phase::Paused => return Ok(()),
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

/// Check the edit like `campaign create` and store it as the campaign's
/// next content version.
pub fn edit(conn: &mut Conn, req: &EditRequest) -> Result<Edited, CampaignError> {
    let c = campaigns::find(conn, &req.name)?;
    let counters = campaigns::counters(conn, c.id)?;
    refuse_state(&c.name, CampaignStatus::new(&c, &counters).state)?;
    let given = [
        req.subject.is_some(),
        req.html.is_some(),
        req.text.is_some(),
        req.markdown.is_some(),
        req.from.is_some(),
        req.track.is_some(),
    ];
    if !given.contains(&true) {
        return Err(CampaignError::Bad(
            "nothing to change: give --subject, --html [--text], --text, --markdown, --from or --track"
                .into(),
        ));
    }
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
    let body = (parts.html.as_str(), parts.text.as_str());
    let Some(version) = stored::edit(conn, c.id, &fields, parts.kind, body, &tracking)? else {
        // A `resume` or `cancel` came between the check and the write.
        let now = campaigns::find(conn, &req.name)?;
        let counters = campaigns::counters(conn, now.id)?;
        refuse_state(&now.name, CampaignStatus::new(&now, &counters).state)?;
        return Err(CampaignError::Bad(format!(
            "campaign {:?} changed while it was being edited; try again",
            now.name
        )));
    };
    let mut warnings = Vec::new();
    if req.from.is_some() {
        let domain = compose::from_domain(&from);
        if dkim_keys::for_domain(conn, &domain)?.is_empty() {
            warnings.push(Warning::NoDkimKey(domain.clone()));
        }
        if let Some(w) = compose::align::warning(&domain, c.return_path.as_deref()) {
            warnings.push(Warning::Unaligned(w));
        }
    }
    Ok(Edited {
        name: c.name,
        version,
        warnings,
    })
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
