//! The compose stage: one recipient's message exactly as it goes on the
//! wire. The campaign's template is rendered (see [`templates`]), the MIME
//! message built with lettre (text and HTML alternatives; every header value
//! goes through lettre's encoder, so nothing a recipient's data holds can
//! add a header or a recipient), and the SMTP envelope set. The worker and
//! `mailsplit preview` both call [`compose`], so a preview is the real
//! message.

use std::str::FromStr;

use lettre::address::Envelope;
use lettre::message::{header::ContentType, Mailbox, MultiPart, SinglePart};
use lettre::{Address, Message};

use crate::mail::Composed;
use crate::store::{campaigns, recipients, Campaign, Conn, Recipient, RecipientStatus, StoreError};
use crate::templates::{self, Context};

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
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ComposeError {
    /// Errors in what the user typed (exit code 2).
    pub fn is_usage(&self) -> bool {
        match self {
            ComposeError::Store(e) => e.is_usage(),
            ComposeError::Unsendable { .. } => false,
            _ => true,
        }
    }
}

/// Parse `--from`: a bare address or `Name <address>`.
pub fn parse_from(raw: &str) -> Result<Mailbox, ComposeError> {
    if raw.chars().any(char::is_control) {
        return Err(ComposeError::BadFrom(raw.to_string()));
    }
    Mailbox::from_str(raw.trim()).map_err(|_| ComposeError::BadFrom(raw.to_string()))
}

/// What every message of one campaign shares.
#[derive(Debug, Clone)]
pub struct CampaignMail {
    pub id: i64,
    pub name: String,
    pub template: String,
    pub subject: String,
    pub from: Mailbox,
}

impl CampaignMail {
    pub fn new(c: &Campaign) -> Result<CampaignMail, ComposeError> {
        Ok(CampaignMail {
            id: c.id,
            name: c.name.clone(),
            template: c.template.clone(),
            subject: c.subject.clone(),
            from: parse_from(&c.from_addr)?,
        })
    }
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

fn build(campaign: &CampaignMail, r: &Recipient) -> Result<Composed, Unsendable> {
    if r.status != RecipientStatus::Active {
        return Err(Unsendable::Inactive(r.status));
    }
    let attributes: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&r.attributes).unwrap_or_default();
    let fallback_unsubscribe;
    let unsubscribe_url = match attributes.get("unsubscribe_url").and_then(|v| v.as_str()) {
        Some(u) => u,
        None => {
            fallback_unsubscribe = format!("mailto:{}?subject=unsubscribe", campaign.from.email);
            &fallback_unsubscribe
        }
    };
    let ctx = Context {
        subject: &campaign.subject,
        name: &r.name,
        email: &r.email,
        attributes: &attributes,
        unsubscribe_url,
    };
    let rendered = templates::render(&campaign.template, &ctx)
        .map_err(|e| Unsendable::Invalid(format!("{e:#}")))?;
    let message_id = format!(
        "<{}.{}.mailsplit@{}>",
        campaign.id,
        r.id,
        campaign.from.email.domain()
    );
    mime(
        &campaign.from,
        &campaign.subject,
        message_id,
        &r.name,
        &r.email,
        rendered.html,
        rendered.text,
    )
}

/// Build the MIME message (text + HTML alternative parts). Header values go
/// through lettre's encoder, so a name holding CR/LF or "Bcc:" stays inside
/// its encoded-word and can never add a header or a recipient; the envelope
/// names exactly one recipient.
fn mime(
    from: &Mailbox,
    subject: &str,
    message_id: String,
    to_name: &str,
    to_email: &str,
    html: String,
    text: String,
) -> Result<Composed, Unsendable> {
    let address = Address::from_str(to_email)
        .map_err(|_| Unsendable::Invalid(format!("invalid recipient address {to_email:?}")))?;
    let build_err =
        |e: lettre::error::Error| Unsendable::Invalid(format!("cannot build the message: {e}"));
    // Control characters never reach a header: lettre's encoder refuses
    // (panics on) a display name with CR/LF, and they have no business there.
    let name = one_line(to_name);
    // The envelope is given, not derived from the headers: lettre's own
    // derivation fails on a quoted local part ("john q. public"@…).
    let envelope =
        Envelope::new(Some(from.email.clone()), vec![address.clone()]).map_err(build_err)?;
    let to = Mailbox::new((!name.is_empty()).then_some(name), address);
    let message = Message::builder()
        .envelope(envelope)
        .from(from.clone())
        .to(to)
        .subject(one_line(subject))
        .message_id(Some(message_id))
        .multipart(
            MultiPart::alternative()
                .singlepart(
                    SinglePart::builder()
                        .header(ContentType::TEXT_PLAIN)
                        .body(text),
                )
                .singlepart(
                    SinglePart::builder()
                        .header(ContentType::TEXT_HTML)
                        .body(html),
                ),
        )
        .map_err(build_err)?;
    Ok(Composed {
        envelope: message.envelope().clone(),
        bytes: message.formatted(),
    })
}

/// `text` with every control character (CR, LF, TAB, …) turned into a
/// space, trimmed: safe for a header value.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// The message a recipient of a campaign would get, exactly as a worker
/// composes it (for `mailsplit preview`): to `email`, or to the first
/// member of the campaign's list.
pub fn preview(
    conn: &mut Conn,
    campaign: &str,
    email: Option<&str>,
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
    compose(&CampaignMail::new(&c)?, &r)
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
mod tests {
    use super::*;

    #[test]
    fn header_injection_stays_in_its_header() {
        let from = parse_from("Shop <news@example.test>").unwrap();
        let msg = mime(
            &from,
            "Hi",
            "<1.2@mailsplit>".into(),
            "x\r\nBcc: victim@evil.test",
            "ada@example.test",
            "<p>hi</p>".into(),
            "hi".into(),
        )
        .unwrap();
        let text = String::from_utf8(msg.bytes).unwrap();
        assert!(!text.contains("\r\nBcc:"), "{text}");
        assert_eq!(msg.envelope.to().len(), 1);
        assert!(mime(
            &from,
            "s",
            "<x@y>".into(),
            "",
            "not an address",
            String::new(),
            String::new()
        )
        .is_err());
        assert!(parse_from("bad\r\nBcc: x@y").is_err());
    }
}
