//! One message's MIME: the text and HTML parts as an alternative, the
//! headers every message carries, each user-written value encoded so that
//! it can never add a header or a recipient.

use std::str::FromStr;

use lettre::address::Envelope;
use lettre::message::header::{ContentType, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::{Address, Message};

use super::{fold, transfer, Unsendable};
use crate::mail::Composed;
use crate::templates::Rendered;

/// Build the MIME message (text + HTML alternative parts) with the `extra`
/// headers. Header values go through lettre's encoder, so a name holding
/// CR/LF or "Bcc:" stays inside its encoded-word and can never add a header
/// or a recipient; the envelope names exactly one recipient.
pub(crate) fn mime(
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
pub(super) fn display_name(name: &str) -> String {
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
