//! One message's MIME: the text and HTML parts as an alternative, the
//! headers every message carries, each user-written value encoded so that
//! it can never add a header or a recipient.

use std::fmt::Write as _;
use std::str::FromStr;

use lettre::address::Envelope;
use lettre::message::header::{self, HeaderName, HeaderValue, Headers};
use lettre::message::{Body, Mailbox};
use lettre::Address;
use rand::distr::{Alphanumeric, SampleString};

use super::{fold, transfer, Unsendable};
use crate::mail::Composed;
use crate::templates::Rendered;

/// Header lines as they go on the wire, each `Name: value` and CRLF, in
/// the order given (lettre's formatting of encoded values).
pub(crate) fn header_lines(values: impl IntoIterator<Item = HeaderValue>) -> String {
    let mut headers = Headers::new();
    for value in values {
        headers.insert_raw(value);
    }
    headers.to_string()
}

/// Build the MIME message (text + HTML alternative parts) from `from` with
/// the `extra` headers; see [`mime_under`].
pub(crate) fn mime(
    from: &Mailbox,
    subject: &str,
    message_id: String,
    to_name: &str,
    to_email: &str,
    rendered: Rendered,
    extra: Vec<HeaderValue>,
) -> Result<Composed, Unsendable> {
    let fixed = header_lines([fold::mailbox("From", from)]);
    mime_under(
        (from, &fixed),
        subject,
        &message_id,
        (to_name, to_email),
        rendered,
        extra,
    )
}

/// Build the MIME message: `fixed`, the header lines every message of a
/// campaign shares (From first, built once per campaign, see
/// [`super::CampaignMail`]), then this message's To, Subject, Message-ID,
/// the `extra` headers, and the text and HTML parts as an alternative.
///
/// Written here rather than by lettre's `MessageBuilder`, which rebuilt
/// and re-encoded every shared header and copied each part twice per
/// message (a sixth of a worker's CPU). Header values still go through
/// the encoders of [`fold`] and lettre, so a name holding CR/LF or "Bcc:"
/// stays inside its encoded-word and can never add a header or a
/// recipient; the envelope names exactly one recipient.
pub(crate) fn mime_under(
    (from, fixed): (&Mailbox, &str),
    subject: &str,
    message_id: &str,
    (to_name, to_email): (&str, &str),
    rendered: Rendered,
    extra: Vec<HeaderValue>,
) -> Result<Composed, Unsendable> {
    let invalid = || Unsendable::Invalid(format!("invalid recipient address {to_email:?}"));
    let address = Address::from_str(to_email).map_err(|_| invalid())?;
    let address = crate::mailbox::for_transport(&address).map_err(|_| invalid())?;
    let name = display_name(to_name);
    // The envelope is given, not derived from the headers: lettre's own
    // derivation fails on a quoted local part ("john q. public"@…).
    let envelope = Envelope::new(Some(from.email.clone()), vec![address.clone()])
        .map_err(|e| Unsendable::Invalid(format!("cannot build the message: {e}")))?;
    let to = Mailbox::new((!name.is_empty()).then_some(name), address);
    // User text as fold.rs writes it: printable ASCII as itself (lettre
    // base64-encodes `Linen & Co`), folded so that no line exceeds 998
    // octets (lettre leaves a long word on one line).
    let mut own = Headers::new();
    own.insert_raw(fold::mailbox("To", &to));
    own.insert_raw(fold::unstructured("Subject", subject));
    own.insert_raw(HeaderValue::new(
        HeaderName::new_from_ascii_str("Message-ID"),
        message_id.to_string(),
    ));
    for value in extra {
        own.insert_raw(value);
    }
    own.set(header::MIME_VERSION_1_0);
    own.set(header::Date::now());
    let text = transfer::text(rendered.text);
    let html = transfer::html(rendered.html);
    let boundary = Alphanumeric.sample_string(&mut rand::rng(), 40);
    let mut head = String::with_capacity(fixed.len() + 512);
    head.push_str(fixed);
    // Infallible: fmt::Write for String.
    let _ = write!(
        head,
        "{own}Content-Type: multipart/alternative;\r\n boundary=\"{boundary}\"\r\n\r\n"
    );
    let mut bytes =
        Vec::with_capacity(head.len() + text.as_ref().len() + html.as_ref().len() + 256);
    bytes.extend_from_slice(head.as_bytes());
    part(&mut bytes, &boundary, "text/plain", &text);
    part(&mut bytes, &boundary, "text/html", &html);
    bytes.extend_from_slice(b"--");
    bytes.extend_from_slice(boundary.as_bytes());
    bytes.extend_from_slice(b"--\r\n");
    Ok(Composed { envelope, bytes })
}

/// One part of the alternative: its boundary line, headers and body.
fn part(out: &mut Vec<u8>, boundary: &str, kind: &str, body: &Body) {
    let head = format!(
        "--{boundary}\r\nContent-Type: {kind}; charset=utf-8\r\nContent-Transfer-Encoding: {}\r\n\r\n",
        body.encoding()
    );
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(body.as_ref());
    out.extend_from_slice(b"\r\n");
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
    // Printable ASCII (most names and subjects) has nothing to replace.
    if text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return text.trim().to_string();
    }
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}
