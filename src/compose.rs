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
mod envelope;
pub mod fold;
pub mod headers;
pub mod html_scan;
pub mod message;
mod mime;
pub mod sample;
pub mod source;
pub mod template_links;
pub mod tracking;
pub mod tracking_urls;
pub mod transfer;
mod variant;
pub mod view;

use std::sync::Arc;

use lettre::message::Mailbox;

use crate::dkim::{self, DkimError, SigningKey};
use crate::mail::Composed;
use crate::store::content as stored;
use crate::store::{
    campaigns, dkim_keys, installation, recipients, Campaign, Conn, Recipient, RecipientStatus,
    StoreError,
};
use crate::templates::{self, Context, Rendered};
use crate::tokens::Identity;

pub(crate) use self::mime::mime;
pub use crate::mailbox::dns_name;
use envelope::with_sender;
pub use envelope::{
    envelope_sender, from_domain, message_id_of, parse_from, parse_return_path, read_message_id,
    Verp, MAX_RETURN_PATH_LOCAL,
};
pub use headers::safe_link;
pub use mime::{header_line, MAX_DISPLAY_NAME};

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
    /// The header lines every message of the campaign shares (From,
    /// List-Id, Feedback-ID), encoded on first use, not per message.
    pub head: std::sync::OnceLock<String>,
    /// The unsubscribe link by mail to the sender (for a campaign without
    /// a public URL), made on first use, not per message.
    pub mailto: std::sync::OnceLock<String>,
}

impl CampaignMail {
    /// The header lines every message of the campaign shares.
    fn head(&self) -> &str {
        self.head.get_or_init(|| {
            mime::header_lines([
                fold::mailbox("From", &self.from),
                headers::list_id(&self.list_name, self.list_id, &self.domain),
                headers::feedback_id(
                    &self.name,
                    &self.list_name,
                    &self.template,
                    &self.identity.database_id,
                ),
            ])
        })
    }

    /// A mail to the sender asking to unsubscribe, as a safe link.
    fn mailto_unsubscribe(&self) -> &str {
        self.mailto.get_or_init(|| {
            let mail = format!("mailto:{}?subject=unsubscribe", self.from.email);
            safe_link(&mail).unwrap_or(mail)
        })
    }

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
            head: std::sync::OnceLock::new(),
            mailto: std::sync::OnceLock::new(),
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
    let message_id = message_id_of(&campaign.identity, campaign.id, rid, &campaign.domain);
    let mut message = mime::mime_under(
        (&campaign.from, campaign.head()),
        &subject,
        &message_id,
        (&r.name, to),
        rendered,
        headers::list_unsubscribe(&unsubscribe_url, one_click),
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
    if let Some(subject) = fixed_subject(campaign) {
        return starter(campaign, r, attributes, unsubscribe_url, subject);
    }
    let mut vars = Vars::new(
        &r.name,
        &r.email,
        attributes,
        unsubscribe_url,
        &campaign.name,
    );
    (vars.preferences_url, vars.view_url) = view::own_urls(campaign, rid);
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
    match body {
        Some((html, text)) => Ok((subject, Rendered { html, text })),
        None => starter(campaign, r, attributes, unsubscribe_url, subject),
    }
}

/// The subject when nothing of the message is rendered with minijinja:
/// a campaign without stored content, or stored content whose subject is
/// plain text and whose body is a built-in starter.
fn fixed_subject(campaign: &CampaignMail) -> Option<String> {
    match &campaign.content {
        None => Some(campaign.subject.clone()),
        Some(c) if !c.has_body => c.literal_subject.clone(),
        Some(_) => None,
    }
}

/// The subject and the built-in starter's parts for `r`.
fn starter(
    campaign: &CampaignMail,
    r: &Recipient,
    attributes: &serde_json::Map<String, serde_json::Value>,
    unsubscribe_url: &str,
    subject: String,
) -> Result<(String, Rendered), Unsendable> {
    let ctx = Context {
        subject: &subject,
        name: &r.name,
        email: &r.email,
        attributes,
        unsubscribe_url,
    };
    let rendered = templates::render(&campaign.template, &ctx)
        .map_err(|e| Unsendable::Invalid(format!("{e:#}")))?;
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
    let link = own.unwrap_or_else(|| campaign.mailto_unsubscribe().to_string());
    (link, false)
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
