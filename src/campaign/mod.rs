//! The campaign stage: what `mailsplit campaign create` checks and does,
//! and the campaigns `status` and `campaign list` show. Validation lives
//! here, not in the command line: a campaign is created only from a
//! [`Checked`] request, so every caller gets the same checks in the same
//! order (name, template, From, return path, failure rate, start time,
//! subject, public URL; then the list, in the database).

pub mod ab;
pub mod archive;
pub mod content;
pub mod control;
pub mod edit;
pub mod report;
pub mod status;
pub mod test_send;
mod variants;

use crate::campaign::status::{CampaignStatus, Phase};
use crate::compose;
use crate::compose::tracking::{self, Links};
use crate::config::{self, ConfigError};
use crate::store::autopause::DEFAULT_MAX_COMPLAINT_RATE;
use crate::store::campaigns::{self, NewCampaign};
use crate::store::content::{self as stored, ContentKind, Track, VersionTracking};
use crate::store::{dkim_keys, recipients, Campaign, Conn, StoreError};
use crate::templates::TemplateError;

pub use content::{ContentError, ContentSource, Prepared};
pub use edit::{EditRequest, Edited};

/// Why a campaign could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    /// A value the user typed that no other module judges.
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Content(#[from] ContentError),
    #[error(transparent)]
    Compose(#[from] compose::ComposeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    SendAt(#[from] crate::send_at::SendAtError),
    /// `campaign test`: the relay could not be reached or refused.
    #[error("test send failed: {0}")]
    Send(String),
    /// `campaign delete` of a campaign that is past its draft.
    #[error("campaign {name:?} is {state}: only a draft, or a scheduled campaign before its start (nothing sent), can be deleted; {hint}")]
    NotDraft {
        name: String,
        state: String,
        hint: String,
    },
    /// `campaign edit` of a campaign that is sending, done or cancelled.
    #[error("cannot edit campaign {name:?}: {why}")]
    NotEditable { name: String, why: String },
}

/// `campaign create`'s options, as typed.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub name: String,
    pub list: String,
    /// `--html`/`--text`, `--markdown` or `--template`.
    pub content: ContentSource,
    pub subject: String,
    pub from: String,
    pub priority: Option<u32>,
    pub public_url: Option<String>,
    pub return_path: Option<String>,
    /// `20%`, `0.2` or `off`.
    pub max_failure_rate: String,
    /// `0.3%`, `0.003` or `off` (empty: the default).
    pub max_complaint_rate: String,
    /// `--send-at`: RFC 3339 or `now`.
    pub send_at: Option<String>,
    /// `--track`: `opens`, `clicks`, `opens,clicks`, `none`.
    pub track: Option<String>,
    /// `--variant-subject`, `--variant-html`, `--ab-sample`, `--ab-wait`,
    /// `--ab-metric`.
    pub ab: ab::AbRequest,
}

/// A [`CreateRequest`] whose values passed every check that needs no
/// database.
#[derive(Debug, Clone)]
pub struct Checked {
    request: CreateRequest,
    content: Prepared,
    from: lettre::message::Mailbox,
    return_path: Option<String>,
    public_url: Option<String>,
    max_failure_rate: Option<f64>,
    max_complaint_rate: Option<f64>,
    send_at: Option<i64>,
    tracking: VersionTracking,
    ab: Option<crate::store::ab::NewAb>,
}

/// A created campaign and what its creator should hear about it.
#[derive(Debug)]
pub struct Created {
    pub campaign: Campaign,
    pub list: String,
    pub recipients: i64,
    pub template: String,
    pub priority: i64,
    pub public_url: Option<String>,
    pub warnings: Vec<Warning>,
    /// What it tracks, and how many links it numbered.
    pub track: Track,
    pub links: usize,
    /// Its A/B test, if it has one.
    pub ab: Option<crate::store::ab::NewAb>,
}

/// Something large providers require of bulk mail that this campaign's
/// messages will miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// No public URL: no one-click unsubscribe (RFC 8058).
    NoPublicUrl,
    /// No DKIM key for the From domain: the mail goes out unsigned.
    NoDkimKey(String),
    /// The return path's domain is not aligned with From's (SPF/DMARC).
    Unaligned(String),
    /// Something in the content that mail clients strip (scripts).
    Content(String),
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::NoPublicUrl => write!(
                f,
                "no --public-url (or MAILSPLIT_PUBLIC_URL): the messages will carry no \
                 one-click unsubscribe (RFC 8058), which Gmail, Yahoo and Outlook require of bulk mail"
            ),
            Warning::NoDkimKey(domain) => write!(
                f,
                "{domain} has no DKIM key: the messages go out unsigned, and large \
                 providers reject or junk unsigned bulk mail; `mailsplit dkim keygen {domain}` makes one"
            ),
            Warning::Unaligned(why) | Warning::Content(why) => write!(f, "{why}"),
        }
    }
}

/// Check everything that needs no database, in the documented order.
pub fn check(request: CreateRequest) -> Result<Checked, CampaignError> {
    config::check_campaign_name(&request.name)?;
    if let ContentSource::Template(name) = &request.content {
        crate::templates::check(name)?;
    }
    let from = compose::parse_from(&request.from)?;
    let return_path = request
        .return_path
        .as_deref()
        .filter(|r| !r.trim().is_empty())
        .map(compose::parse_return_path)
        .transpose()?;
    let max_failure_rate = parse_share("--max-failure-rate", "20%", &request.max_failure_rate)?;
    let max_complaint_rate = match request.max_complaint_rate.trim() {
        "" => Some(DEFAULT_MAX_COMPLAINT_RATE),
        raw => parse_share("--max-complaint-rate", "0.3%", raw)?,
    };
    let send_at = request
        .send_at
        .as_deref()
        .map(|raw| crate::send_at::parse(raw, crate::store::now_ms()))
        .transpose()?
        .flatten();
    let Contents {
        content,
        public_url,
        tracking,
        ab,
    } = check_contents(&request)?;
    Ok(Checked {
        request,
        content,
        from,
        return_path,
        public_url,
        max_failure_rate,
        max_complaint_rate,
        send_at,
        tracking,
        ab,
    })
}

/// What a request's recipients get, checked: the content converted, the
/// public URL its pixel and links point at, what it tracks, its A/B test.
struct Contents {
    content: Prepared,
    public_url: Option<String>,
    tracking: VersionTracking,
    ab: Option<crate::store::ab::NewAb>,
}

/// The subject, content, public URL, tracking and A/B test, in that order.
fn check_contents(request: &CreateRequest) -> Result<Contents, CampaignError> {
    let subject = &request.subject;
    check_subject(subject)?;
    let mut content = content::prepare(&request.name, subject, &request.content)?;
    let public_url = request
        .public_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
        .map(config::parse_public_url)
        .transpose()?;
    let track = parse_track(request.track.as_deref().unwrap_or(""))?;
    let tracking = tracking_of(
        (content.kind, &content.label),
        (&content.html, &content.text),
        track,
        public_url.as_deref(),
    )?;
    let main = ab::Main {
        name: &request.name,
        subject,
        track: tracking.track,
        public_url: public_url.as_deref(),
    };
    let ab = ab::check(&request.ab, &main)?.map(|checked| {
        content.warnings.extend(checked.warnings);
        checked.test
    });
    Ok(Contents {
        content,
        public_url,
        tracking,
        ab,
    })
}

/// `--track`: `opens`, `clicks`, both (comma-separated, any order), or
/// `none`/empty for nothing.
pub fn parse_track(raw: &str) -> Result<Track, CampaignError> {
    let mut track = Track::default();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.to_ascii_lowercase().as_str() {
            "opens" => track.opens = true,
            "clicks" => track.clicks = true,
            "none" => {}
            _ => {
                return Err(CampaignError::Bad(format!(
                    "bad --track {raw:?}: use opens, clicks, opens,clicks or none"
                )))
            }
        }
    }
    Ok(track)
}

/// What a content version stores for `track`: its link table, made once
/// here from the templates. Tracking needs the public URL (the pixel and
/// the links point at `mailsplit serve` there).
pub(crate) fn tracking_of(
    (kind, label): (ContentKind, &str),
    parts: (&str, &str),
    track: Track,
    public_url: Option<&str>,
) -> Result<VersionTracking, CampaignError> {
    if !track.any() {
        return Ok(VersionTracking::default());
    }
    let Some(base) = public_url else {
        return Err(CampaignError::Bad(format!(
            "--track {track} needs --public-url (or MAILSPLIT_PUBLIC_URL): the pixel and the links point at `mailsplit serve` there"
        )));
    };
    let mut links = Links::new();
    if let Some((html, text)) = tracking::body_sources(kind, label, parts, track) {
        tracking::rewrite(html, text, track, base, &mut links);
    }
    // The text part's links too: a redirect to one must be a valid Location.
    if let Some(bad) = links
        .urls()
        .iter()
        .find(|u| u.chars().any(char::is_control))
    {
        return Err(CampaignError::Bad(format!(
            "link {bad:?} holds a control character: no redirect can answer with it; remove it from the content"
        )));
    }
    Ok(VersionTracking {
        track,
        links: links.into_urls(),
    })
}

/// `--subject` is one non-empty line.
fn check_subject(subject: &str) -> Result<(), CampaignError> {
    if subject.trim().is_empty() || subject.chars().any(char::is_control) {
        return Err(CampaignError::Bad(
            "--subject must be one non-empty line".into(),
        ));
    }
    Ok(())
}

/// Create the campaign for its list (which must exist), with the default
/// priority for the list's size unless one was given.
pub fn create(conn: &mut Conn, checked: Checked) -> Result<Created, CampaignError> {
    let r = &checked.request;
    let list_id = recipients::find_list(conn, &r.list)?;
    let size = recipients::list_size(conn, list_id)?;
    let priority = r.priority.map_or_else(|| default_priority(size), i64::from);
    let campaign = insert(conn, &checked, list_id, size, priority)?;
    let mut warnings: Vec<Warning> = checked
        .content
        .warnings
        .iter()
        .cloned()
        .map(Warning::Content)
        .collect();
    if checked.public_url.is_none() {
        warnings.push(Warning::NoPublicUrl);
    }
    warnings.extend(sender_warnings(
        conn,
        &checked.from,
        checked.return_path.as_deref(),
    )?);
    Ok(Created {
        campaign,
        list: checked.request.list,
        recipients: size,
        template: checked.content.label,
        priority,
        public_url: checked.public_url,
        warnings,
        track: checked.tracking.track,
        links: checked.tracking.links.len(),
        ab: checked.ab,
    })
}

/// The campaign row, its first content version and its A/B test, in one
/// transaction.
fn insert(
    conn: &mut Conn,
    checked: &Checked,
    list_id: i64,
    size: i64,
    priority: i64,
) -> Result<Campaign, StoreError> {
    let (r, c) = (&checked.request, &checked.content);
    let from_addr = checked.from.to_string();
    let new = NewCampaign {
        name: &r.name,
        list_id,
        template: &c.label,
        subject: &r.subject,
        from_addr: &from_addr,
        priority,
        recipients: size,
        public_url: checked.public_url.as_deref(),
        return_path: checked.return_path.as_deref(),
        max_failure_rate: checked.max_failure_rate,
        max_complaint_rate: checked.max_complaint_rate,
        send_at: checked.send_at,
    };
    conn.transaction(|conn| {
        let campaign = campaigns::create(conn, &new)?;
        let tracking = &checked.tracking;
        stored::add(
            conn,
            campaign.id,
            c.kind,
            &c.subject,
            &c.html,
            &c.text,
            tracking,
        )?;
        if let Some(test) = &checked.ab {
            crate::store::ab::create(conn, campaign.id, test)?;
        }
        Ok(campaign)
    })
}

/// What a sender lacks: no DKIM key for the From domain, or a From that
/// does not align with the return path.
fn sender_warnings(
    conn: &mut Conn,
    from: &lettre::message::Mailbox,
    return_path: Option<&str>,
) -> Result<Vec<Warning>, StoreError> {
    let mut warnings = Vec::new();
    let domain = compose::from_domain(from);
    if dkim_keys::for_domain(conn, &domain)?.is_empty() {
        warnings.push(Warning::NoDkimKey(domain.clone()));
    }
    if let Some(w) = compose::align::warning(&domain, return_path) {
        warnings.push(Warning::Unaligned(w));
    }
    Ok(warnings)
}

/// One campaign (by name or id) or all, with their counters, as `status`
/// and `campaign list` show them.
pub fn statuses(conn: &mut Conn, name: Option<&str>) -> Result<Vec<CampaignStatus>, StoreError> {
    let rows = match name {
        Some(name) => {
            let c = campaigns::find(conn, name)?;
            let counters = campaigns::counters(conn, c.id)?;
            vec![(c, counters)]
        }
        None => campaigns::list(conn)?,
    };
    crate::campaign::status::with_versions(conn, &rows)
}

/// What to do instead of deleting a campaign in this phase: stop one that
/// may still send; one that ended stays for its report.
fn delete_hint(phase: Phase, name: &str) -> String {
    match phase {
        Phase::Done | Phase::Cancelled => {
            "it has ended and stays for its history (`mailsplit report` reads it); there is nothing to stop".to_owned()
        }
        _ => format!("`mailsplit cancel {name}` stops it"),
    }
}

/// `campaign delete`: the campaign and its content, counters and ledger,
/// while it is a draft or scheduled with nothing sent (its jobs are
/// dropped as workers meet them). Returns its name.
pub fn delete(conn: &mut Conn, name_or_id: &str) -> Result<String, CampaignError> {
    let c = campaigns::find(conn, name_or_id)?;
    match crate::store::drafts::delete_draft(conn, name_or_id)? {
        None => Ok(c.name),
        Some(now) => {
            let counters = campaigns::counters(conn, now.id)?;
            let phase = CampaignStatus::new(&now, &counters).state;
            Err(CampaignError::NotDraft {
                hint: delete_hint(phase, &now.name),
                name: now.name,
                state: phase.to_string(),
            })
        }
    }
}

/// `--max-failure-rate` and `--max-complaint-rate` (`flag`): a percentage
/// (`20%`), a fraction (`0.2`) or `off`.
fn parse_share(flag: &str, example: &str, raw: &str) -> Result<Option<f64>, CampaignError> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("off") || raw.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let rate = match raw.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().ok().map(|p| p / 100.0),
        None => raw.parse::<f64>().ok(),
    };
    match rate {
        Some(r) if (0.0..=1.0).contains(&r) => Ok(Some(r)),
        _ => Err(CampaignError::Bad(format!(
            "bad {flag} {raw:?}: use a percentage ({example}), a fraction (0.2 is 20%) or off"
        ))),
    }
}

/// Smaller lists get more urgent priorities (lower numbers), so a small
/// campaign's jobs are not stuck behind a big one's: 100 for a handful of
/// recipients, 300 for a million.
pub fn default_priority(list_size: i64) -> i64 {
    let bits = 64 - (list_size.max(1) as u64).leading_zeros() as i64;
    100 + 10 * bits
}
