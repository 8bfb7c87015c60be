//! The compose stage: one recipient's message exactly as it goes on the
//! wire. The campaign's template is rendered (see [`templates`]), the MIME
//! message built with lettre (text and HTML alternatives; every header value
//! goes through lettre's encoder, so nothing a recipient's data holds can
//! add a header or a recipient), the headers bulk mail needs added (see
//! [`headers`]), the message signed with the From domain's DKIM keys (see
//! [`dkim`]), and the SMTP envelope set. The worker and `mailsplit preview`
//! both call [`compose`], so a preview is the real message.

pub mod align;
pub mod content;
pub mod fold;
pub mod headers;
pub mod html_scan;
pub mod message;
pub mod sample;
pub mod source;
pub mod template_links;
pub mod tracking;
pub mod tracking_urls;
pub mod transfer;

use std::str::FromStr;
use std::sync::Arc;

use lettre::address::Envelope;
use lettre::message::header::{ContentType, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::{Address, Message};

use crate::dkim::{self, DkimError, SigningKey};
use crate::mail::Composed;
use crate::store::content as stored;
use crate::store::{
    campaigns, dkim_keys, installation, recipients, Campaign, Conn, Recipient, RecipientStatus,
    StoreError,
};
use crate::templates::{self, Context, Rendered};
use crate::tokens::Identity;

pub use crate::mailbox::dns_name;
pub use headers::safe_link;

use content::{Cache, Compiled, TemplateProblem, Vars};

#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    #[error("bad sender address {0:?}: use user@example.com or \"Name <user@example.com>\"")]
    BadFrom(String),
    #[error("no recipient {0:?}")]
    UnknownRecipient(String),
    #[error("the list of campaign {0:?} is empty")]
    EmptyList(String),
    #[error("{email} would get no message: {why}")]
    Unsendable { email: String, why: String },
    #[error("bad return path {0:?}: use local@bounce-domain, with a local part of at most {MAX_RETURN_PATH_LOCAL} characters and no '+' (the VERP token goes after it)")]
    BadReturnPath(String),
    #[error(transparent)]
    Dkim(#[from] DkimError),
    #[error("the stored content does not compile: {0}")]
    Content(#[from] TemplateProblem),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ComposeError {
    /// Errors in what the user typed (exit code 2).
    pub fn is_usage(&self) -> bool {
        match self {
            ComposeError::Store(e) => e.is_usage(),
            ComposeError::Unsendable { .. } | ComposeError::Dkim(_) | ComposeError::Content(_) => {
                false
            }
            _ => true,
        }
    }
}

/// Parse `--from`: a bare address or `Name <address>`.
pub fn parse_from(raw: &str) -> Result<Mailbox, ComposeError> {
    if raw.chars().any(char::is_control) {
        return Err(ComposeError::BadFrom(raw.to_string()));
    }
    let mailbox =
        Mailbox::from_str(raw.trim()).map_err(|_| ComposeError::BadFrom(raw.to_string()))?;
    // The domain must have an A-label: that is how it goes on the wire.
    on_the_wire(mailbox.clone()).map_err(|_| ComposeError::BadFrom(raw.to_string()))?;
    Ok(mailbox)
}

/// The From domain of a sender as DKIM keys are filed under and headers
/// name it: lower case, A-labels.
pub fn from_domain(from: &Mailbox) -> String {
    let domain = from.email.domain();
    dns_name(domain).unwrap_or_else(|| domain.to_ascii_lowercase())
}

/// Longest local part of a `--return-path`: the VERP token (up to 29
/// characters for campaigns below 2 million and recipients below 34
/// billion) and the `+` must still fit in 64 octets.
pub const MAX_RETURN_PATH_LOCAL: usize = 32;

/// Check `--return-path`: `local@domain`, the local part short enough for
/// `local+TOKEN` and free of `+` (Postfix splits the extension at the
/// first one). Returns the canonical spelling (domain folded).
pub fn parse_return_path(raw: &str) -> Result<String, ComposeError> {
    let bad = || ComposeError::BadReturnPath(raw.to_string());
    let addr = Address::from_str(raw.trim()).map_err(|_| bad())?;
    let local = addr.user();
    if local.len() > MAX_RETURN_PATH_LOCAL
        || local.contains('+')
        || local.starts_with('"')
        || raw.chars().any(char::is_control)
    {
        return Err(bad());
    }
    Ok(format!("{local}@{}", addr.domain().to_lowercase()))
}

/// A campaign's VERP return path, `local@domain`: each message's envelope
/// sender is `local+TOKEN@domain`, TOKEN naming campaign and recipient
/// under the database's secret (see [`envelope_sender`]).
#[derive(Debug, Clone)]
pub struct Verp {
    local: String,
    domain: String,
}

impl Verp {
    fn parse(raw: &str) -> Result<Verp, ComposeError> {
        let canonical = parse_return_path(raw)?;
        let (local, domain) = canonical
            .rsplit_once('@')
            .ok_or_else(|| ComposeError::BadReturnPath(raw.to_string()))?;
        Ok(Verp {
            local: local.to_string(),
            domain: domain.to_string(),
        })
    }
}

/// The envelope sender (MAIL FROM, where bounces go) of one recipient's
/// message: the campaign's VERP address for this recipient, or the From
/// address when the campaign has no return path. The From header is never
/// changed.
pub fn envelope_sender(campaign: &CampaignMail, recipient_id: i64) -> Address {
    campaign
        .verp
        .as_ref()
        .and_then(|v| {
            let token = campaign
                .identity
                .signer
                .verp_token(campaign.id, recipient_id);
            Address::new(format!("{}+{token}", v.local), &v.domain).ok()
        })
        .unwrap_or_else(|| campaign.from.email.clone())
}

/// The message with `sender` as its envelope sender (the headers stay as
/// they are: the From header is the campaign's).
fn with_sender(mut message: Composed, sender: Address) -> Result<Composed, Unsendable> {
    message.envelope = Envelope::new(Some(sender), message.envelope.to().to_vec())
        .map_err(|e| Unsendable::Invalid(format!("cannot build the envelope: {e}")))?;
    Ok(message)
}

/// The (campaign, recipient) a Message-ID of this database's messages
/// names (see [`headers::message_id`]); `None` for anyone else's and for
/// every made-up one: the token in it is an HMAC under the database's
/// secret. The sequential ids of older versions (`<C.R.db-…@…>`) are not
/// read: anybody could write one.
pub fn read_message_id(id: &str, identity: &Identity) -> Option<(i64, i64)> {
    let id = id.trim().trim_start_matches('<').trim_end_matches('>');
    let (local, _) = id.rsplit_once('@')?;
    let (token, _database) = local.split_once('.')?;
    identity.signer.read_message_id_token(token)
}

/// The Message-ID of one campaign's message to one recipient.
pub fn message_id_of(identity: &Identity, campaign: i64, recipient: i64, domain: &str) -> String {
    let token = identity.signer.message_id_token(campaign, recipient);
    headers::message_id(&token, &identity.database_id, domain)
}

/// What every message of one campaign shares.
#[derive(Debug, Clone)]
pub struct CampaignMail {
    pub id: i64,
    pub name: String,
    pub template: String,
    pub subject: String,
    pub from: Mailbox,
    /// The From domain, see [`from_domain`].
    pub domain: String,
    pub list_id: i64,
    pub list_name: String,
    /// Base of the one-click unsubscribe links (`campaign create
    /// --public-url`); without it there is no one-click unsubscribe.
    pub public_url: Option<String>,
    /// This database: signs the links' tokens, and names the sender in
    /// Message-ID and Feedback-ID.
    pub identity: Identity,
    /// The From domain's DKIM keys; none: the mail goes unsigned.
    pub dkim: Arc<[Arc<SigningKey>]>,
    /// The VERP return path (`campaign create --return-path`).
    pub verp: Option<Verp>,
    /// The stored content version, compiled; `None` for a campaign made
    /// before content was stored (literal subject, built-in template).
    pub content: Option<Arc<Compiled>>,
    /// Its version number (0: none stored).
    pub content_version: i64,
}

impl CampaignMail {
    /// Read what the campaign's messages share: its list's name and its
    /// From domain's DKIM keys.
    pub fn load(
        conn: &mut Conn,
        c: &Campaign,
        identity: &Identity,
    ) -> Result<CampaignMail, ComposeError> {
        Self::load_cached(conn, c, identity, &Cache::default())
    }

    /// [`CampaignMail::load`], taking the compiled content from `cache`
    /// (compiling it there on first use).
    pub fn load_cached(
        conn: &mut Conn,
        c: &Campaign,
        identity: &Identity,
        cache: &Cache,
    ) -> Result<CampaignMail, ComposeError> {
        let stored = stored::latest(conn, c.id)?;
        let content_version = stored.as_ref().map_or(0, |s| s.version);
        let compiled = match stored {
            None => None,
            Some(s) => Some(match cache.get((c.id, s.version)) {
                Some(hit) => hit,
                None => {
                    let links = tracking::stored_links(conn, c, &s)?;
                    cache.get_or_compile((c.id, s.version), || {
                        tracking::compile_stored(&s, c, links)
                    })?
                }
            }),
        };
        let from = parse_from(&c.from_addr)?;
        let domain = from_domain(&from);
        let keys = dkim_keys::for_domain(conn, &domain)?
            .iter()
            .map(SigningKey::cached)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CampaignMail {
            id: c.id,
            name: c.name.clone(),
            template: c.template.clone(),
            subject: c.subject.clone(),
            from: on_the_wire(from).map_err(|_| ComposeError::BadFrom(c.from_addr.clone()))?,
            domain,
            list_id: c.list_id,
            list_name: recipients::list_name(conn, c.list_id)?,
            public_url: c.public_url.clone(),
            identity: identity.clone(),
            dkim: keys.into(),
            verp: c.return_path.as_deref().map(Verp::parse).transpose()?,
            content: compiled,
            content_version,
        })
    }
}

/// `mailbox` with its domain as an A-label (`news@exämple.com` →
/// `news@xn--exmple-cua.com`), the spelling every relay takes in MAIL FROM,
/// RCPT TO and the headers; see [`crate::mailbox`].
fn on_the_wire(mailbox: Mailbox) -> Result<Mailbox, crate::mailbox::MailboxError> {
    Ok(Mailbox::new(
        mailbox.name,
        crate::mailbox::for_transport(&mailbox.email)?,
    ))
}

/// Why a recipient gets no message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsendable {
    /// Unsubscribed or bounced: skipped, not failed.
    Inactive(RecipientStatus),
    /// The message cannot be built for this recipient (bad address,
    /// template error): failed.
    Invalid(String),
}

/// One recipient's message, or why there is none. A panic inside a library
/// while building it becomes [`Unsendable::Invalid`] for this one
/// recipient, so a job's accounting always completes.
pub fn compose(campaign: &CampaignMail, r: &Recipient) -> Result<Composed, Unsendable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(campaign, r))).unwrap_or_else(
        |_| {
            tracing::error!(
                recipient = r.id,
                "composing the message panicked; recording it as failed"
            );
            Err(Unsendable::Invalid(
                "internal error while composing the message".into(),
            ))
        },
    )
}

/// The attributes composing `campaign`'s messages reads (its templates'
/// and the recipient's own `unsubscribe_url`), or `None` for all of them.
pub fn attributes_needed(campaign: &CampaignMail) -> Option<Vec<String>> {
    let mut used = campaign.content.as_ref()?.attributes_used()?;
    used.insert("unsubscribe_url".to_string());
    Some(used.into_iter().collect())
}

fn build(campaign: &CampaignMail, r: &Recipient) -> Result<Composed, Unsendable> {
    build_active(campaign, r, Purpose::Send)
}

fn build_active(
    campaign: &CampaignMail,
    r: &Recipient,
    purpose: Purpose,
) -> Result<Composed, Unsendable> {
    if r.status != RecipientStatus::Active {
        return Err(Unsendable::Inactive(r.status));
    }
    build_for(campaign, r, purpose)
}

/// What a composed message is for, which decides whom its tokens name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose<'a> {
    /// The real message: its links act for the recipient.
    Send,
    /// Shown to the operator (`preview`): the recipient's message, with
    /// links that name [`TEST_RECIPIENT`], so clicking one while reading
    /// a preview unsubscribes or credits nobody.
    Preview,
    /// `campaign test`: like a preview, sent to another address with
    /// `[TEST]` before the subject.
    Test { to: &'a str },
}

/// Recipient id the links, Message-ID and VERP sender of a test message
/// name: a valid token that names nobody.
pub const TEST_RECIPIENT: i64 = 0;

/// `campaign test`: the message `r` would get, rendered for `r` but
/// addressed to `to`, subject prefixed `[TEST] `, signed like the real
/// ones; its tokens name recipient [`TEST_RECIPIENT`], so its unsubscribe
/// link unsubscribes nobody and a bounce of it changes nobody.
pub fn compose_test(
    campaign: &CampaignMail,
    r: &Recipient,
    to: &str,
) -> Result<Composed, Unsendable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build_for(campaign, r, Purpose::Test { to })
    }))
    .unwrap_or_else(|_| Err(Unsendable::Invalid("internal error while composing".into())))
}

/// One message rendered for `r`, for `purpose`.
fn build_for(
    campaign: &CampaignMail,
    r: &Recipient,
    purpose: Purpose,
) -> Result<Composed, Unsendable> {
    let rid = match purpose {
        Purpose::Send => r.id,
        Purpose::Preview | Purpose::Test { .. } => TEST_RECIPIENT,
    };
    let attributes: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&r.attributes).unwrap_or_default();
    // Only the real message carries the recipient's own unsubscribe link.
    let own = match purpose {
        Purpose::Send => &attributes,
        _ => &Default::default(),
    };
    let (unsubscribe_url, one_click) = unsubscribe(campaign, rid, own);
    let (mut subject, rendered) = render(campaign, (rid, r), &attributes, &unsubscribe_url)?;
    let to = match purpose {
        Purpose::Test { to } => {
            subject = format!("[TEST] {subject}");
            to
        }
        _ => &r.email,
    };
    let database = &campaign.identity.database_id;
    let message_id = message_id_of(&campaign.identity, campaign.id, rid, &campaign.domain);
    let mut extra = vec![
        headers::list_id(&campaign.list_name, campaign.list_id, &campaign.domain),
        headers::feedback_id(
            &campaign.name,
            &campaign.list_name,
            &campaign.template,
            database,
        ),
    ];
    extra.extend(headers::list_unsubscribe(&unsubscribe_url, one_click));
    let mut message = mime(
        &campaign.from,
        &subject,
        message_id,
        &r.name,
        to,
        rendered,
        extra,
    )?;
    // The encodings add to what the render's cap counted.
    if let Some(cap) = campaign.content.as_ref().map(|c| c.max_message()) {
        if message.bytes.len() > cap {
            return Err(Unsendable::Invalid(
                content::RenderError::TooLarge { cap }.to_string(),
            ));
        }
    }
    message.bytes = dkim::sign(&campaign.dkim, message.bytes)
        .map_err(|e| Unsendable::Invalid(e.to_string()))?;
    with_sender(message, envelope_sender(campaign, rid))
}

/// The subject and both parts of one recipient's message: the stored
/// content rendered with minijinja, or the built-in starter (askama).
fn render(
    campaign: &CampaignMail,
    (rid, r): (i64, &Recipient),
    attributes: &serde_json::Map<String, serde_json::Value>,
    unsubscribe_url: &str,
) -> Result<(String, Rendered), Unsendable> {
    let invalid = |e: &dyn std::fmt::Display| Unsendable::Invalid(format!("{e:#}"));
    let mut vars = Vars::new(
        &r.name,
        &r.email,
        attributes,
        unsubscribe_url,
        &campaign.name,
    );
    let (subject, body) = match &campaign.content {
        Some(c) => {
            if let Some(t) = &c.tracking {
                let urls = t.urls(&campaign.identity.signer, campaign.id, rid);
                vars.open_url = urls.open;
                vars.links = urls.links;
                vars.linker = urls.linker;
            }
            let (subject, room) = c.subject(&vars).map_err(|e| invalid(&e))?;
            vars.campaign.subject = Some(subject.clone());
            (subject, c.body(&vars, room).map_err(|e| invalid(&e))?)
        }
        None => (campaign.subject.clone(), None),
    };
    let rendered = match body {
        Some((html, text)) => Rendered { html, text },
        None => {
            let ctx = Context {
                subject: &subject,
                name: &r.name,
                email: &r.email,
                attributes,
                unsubscribe_url,
            };
            templates::render(&campaign.template, &ctx).map_err(|e| invalid(&e))?
        }
    };
    Ok((subject, rendered))
}

/// Longest link of a recipient's own taken into List-Unsubscribe: a URL
/// cannot be folded, and the header line must stay within 998 octets.
pub const MAX_LINK: usize = 900;

/// The link a recipient leaves by, and whether it is a one-click link: the
/// campaign's own (`<public-url>/u/TOKEN`) when it has a public URL; else
/// the recipient's `unsubscribe_url` attribute if it is an http(s) or
/// mailto link (a `javascript:` one never reaches a message); else a mail
/// to the sender.
fn unsubscribe(
    campaign: &CampaignMail,
    recipient: i64,
    attributes: &serde_json::Map<String, serde_json::Value>,
) -> (String, bool) {
    if let Some(base) = &campaign.public_url {
        let token = campaign
            .identity
            .signer
            .unsubscribe_token(campaign.id, recipient);
        return (headers::unsubscribe_link(base, &token), true);
    }
    let own = attributes
        .get("unsubscribe_url")
        .and_then(|v| v.as_str())
        .and_then(safe_link)
        .filter(|l| l.len() <= MAX_LINK);
    let link = own.unwrap_or_else(|| {
        let mail = format!("mailto:{}?subject=unsubscribe", campaign.from.email);
        safe_link(&mail).unwrap_or(mail)
    });
    (link, false)
}

/// Build the MIME message (text + HTML alternative parts) with the `extra`
/// headers. Header values go through lettre's encoder, so a name holding
/// CR/LF or "Bcc:" stays inside its encoded-word and can never add a header
/// or a recipient; the envelope names exactly one recipient.
fn mime(
    from: &Mailbox,
    subject: &str,
    message_id: String,
    to_name: &str,
    to_email: &str,
    rendered: Rendered,
    extra: Vec<HeaderValue>,
) -> Result<Composed, Unsendable> {
    let invalid = || Unsendable::Invalid(format!("invalid recipient address {to_email:?}"));
    let address = Address::from_str(to_email).map_err(|_| invalid())?;
    let address = crate::mailbox::for_transport(&address).map_err(|_| invalid())?;
    let build_err =
        |e: lettre::error::Error| Unsendable::Invalid(format!("cannot build the message: {e}"));
    let name = display_name(to_name);
    // The envelope is given, not derived from the headers: lettre's own
    // derivation fails on a quoted local part ("john q. public"@…).
    let envelope =
        Envelope::new(Some(from.email.clone()), vec![address.clone()]).map_err(build_err)?;
    let to = Mailbox::new((!name.is_empty()).then_some(name), address);
    let mut builder = Message::builder()
        .envelope(envelope)
        .from(from.clone())
        .to(to.clone())
        .subject(header_line(subject))
        .message_id(Some(message_id));
    for header in extra {
        builder = builder.raw_header(header);
    }
    let mut message = builder
        .multipart(
            MultiPart::alternative()
                .singlepart(
                    SinglePart::builder()
                        .header(ContentType::TEXT_PLAIN)
                        .body(transfer::text(rendered.text)),
                )
                .singlepart(
                    SinglePart::builder()
                        .header(ContentType::TEXT_HTML)
                        .body(transfer::html(rendered.html)),
                ),
        )
        .map_err(build_err)?;
    // User text as fold.rs writes it: printable ASCII as itself (lettre
    // base64-encodes `Linen & Co`), folded so that no line exceeds 998
    // octets (lettre leaves a long word on one line).
    let headers = message.headers_mut();
    headers.insert_raw(fold::mailbox("From", from));
    headers.insert_raw(fold::mailbox("To", &to));
    headers.insert_raw(fold::unstructured("Subject", subject));
    Ok(Composed {
        envelope: message.envelope().clone(),
        bytes: message.formatted(),
    })
}

/// Longest display name put in a To: header, in characters.
pub const MAX_DISPLAY_NAME: usize = 200;

/// A recipient's name as it goes into the To: header: one line (lettre's
/// encoder refuses, by panicking, a display name with CR/LF, and control
/// characters have no business there), cut to [`MAX_DISPLAY_NAME`]
/// characters. lettre folds a header only between words and encodes
/// non-ASCII text in short encoded-words, but a long ASCII word stays on
/// one line: a 2,000-character name made a 2,018-character To: line, over
/// RFC 5322's limit of 998. At 200 characters (each quote escaped at
/// worst) plus an address of at most 254, the line stays far below it.
fn display_name(name: &str) -> String {
    let line = header_line(name);
    match line.char_indices().nth(MAX_DISPLAY_NAME) {
        Some((cut, _)) => line[..cut].trim_end().to_string(),
        None => line,
    }
}

/// `text` with every control character (CR, LF, TAB, …) turned into a
/// space, trimmed: safe for a header value.
pub fn header_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// The message a recipient of a campaign would get, exactly as a worker
/// composes it (for `mailsplit preview`): to `email`, or to the first
/// member of the campaign's list. Its links name nobody unless
/// `real_links` (then following one acts for the recipient).
pub fn preview(
    conn: &mut Conn,
    campaign: &str,
    email: Option<&str>,
    real_links: bool,
) -> Result<Vec<u8>, ComposeError> {
    let c = campaigns::find(conn, campaign)?;
    let id = match email {
        Some(e) => recipients::find_by_email(conn, e)?
            .ok_or_else(|| ComposeError::UnknownRecipient(e.to_string()))?,
        None => recipients::member_page(conn, c.list_id, 0, 1)?
            .first()
            .map(|(id, _)| *id)
            .ok_or_else(|| ComposeError::EmptyList(c.name.clone()))?,
    };
    let r = recipients::load(conn, &[id])?
        .pop()
        .ok_or_else(|| ComposeError::UnknownRecipient(format!("id {id}")))?;
    let identity = Identity::from(&installation::load(conn)?);
    let purpose = if real_links {
        Purpose::Send
    } else {
        Purpose::Preview
    };
    let mail = CampaignMail::load(conn, &c, &identity)?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        build_active(&mail, &r, purpose)
    }))
    .unwrap_or_else(|_| Err(Unsendable::Invalid("internal error while composing".into())))
    .map(|m| m.bytes)
    .map_err(|why| ComposeError::Unsendable {
        email: r.email.clone(),
        why: match why {
            Unsendable::Inactive(s) => format!("the recipient is {s}"),
            Unsendable::Invalid(e) => e,
        },
    })
}

#[cfg(test)]
mod tests;
