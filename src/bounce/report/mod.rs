//! Read one inbound message and say what it reports, without touching the
//! database: RFC 3464 delivery status notifications, RFC 5965 ARF feedback
//! reports, Microsoft JMRP complaints, Amazon SES notifications (JSON),
//! and the common plain-text bounces (qmail, Exim, Exchange, Gmail,
//! Yahoo). MIME is parsed by `mail-parser`; the report bodies (DSN and ARF
//! fields, the plain-text phrasing) here.
//!
//! Only the message's own top-level structure counts: a bounce that
//! somebody forwarded as an attachment is ordinary mail, and so is an
//! auto-reply. What cannot be placed yields a [`ParsedReport`] without findings,
//! which the caller logs and ignores.

use mail_parser::{Message, MessageParser, MimeHeaders, PartType};

mod mime;
mod plain;
mod ses;

use crate::store::bounces::BounceKind;
use mime::{arf, dsn, jmrp};
use plain::plain;
pub use ses::ses;

/// One recipient's fate in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The recipient address the report names, if it names one.
    pub address: Option<String>,
    pub kind: BounceKind,
    /// Enhanced status code (`5.1.1`) or feedback type (`abuse`).
    pub status: Option<String>,
    /// The diagnostic, for the record.
    pub reason: String,
}

/// What a message reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedReport {
    /// `dsn`, `arf`, `jmrp`, `ses` or `plain`; empty when the message is no
    /// report at all.
    pub format: &'static str,
    pub findings: Vec<Finding>,
    /// Addresses that may carry our VERP token: the envelope sender of the
    /// reported message as the report gives it (ARF `Original-Mail-From`,
    /// Postfix's `X-Postfix-Sender`, the returned message's `Return-Path`)
    /// and where the report itself was delivered (`Delivered-To`, `To`, …).
    pub verp_candidates: Vec<String>,
    /// Message-IDs of the reported message (ours name campaign and
    /// recipient).
    pub message_ids: Vec<String>,
}

impl ParsedReport {
    /// A bounce or complaint that names at least a kind.
    pub fn is_report(&self) -> bool {
        !self.format.is_empty()
    }
}

/// Outer headers where the report was delivered to (our VERP address).
const DELIVERED_TO: &[&str] = &["delivered-to", "x-original-to", "envelope-to", "to"];

/// Parse a message. Never fails: what is not a report says so.
pub fn parse(raw: &[u8]) -> ParsedReport {
    let Some(msg) = MessageParser::default().parse(raw) else {
        return ParsedReport::default();
    };
    let mut report = ParsedReport::default();
    for name in DELIVERED_TO {
        for value in header_values(&msg, name) {
            report.verp_candidates.extend(addresses(&value));
        }
    }
    let root = &msg.parts[0];
    let (ctype, subtype, report_type) = match root.content_type() {
        Some(ct) => (
            ct.ctype().to_ascii_lowercase(),
            ct.subtype().unwrap_or("").to_ascii_lowercase(),
            ct.attribute("report-type")
                .unwrap_or("")
                .to_ascii_lowercase(),
        ),
        None => ("text".into(), "plain".into(), String::new()),
    };
    let children: Vec<usize> = root
        .sub_parts()
        .map(|ids| ids.iter().map(|&i| i as usize).collect())
        .unwrap_or_default();
    if ctype == "multipart" && subtype == "report" {
        if report_type.contains("delivery-status") || has_part(&msg, &children, "delivery-status") {
            dsn(&msg, &children, &mut report);
        } else if report_type.contains("feedback-report")
            || has_part(&msg, &children, "feedback-report")
        {
            arf(&msg, &children, &mut report);
        }
    } else if ctype == "multipart" {
        jmrp(&msg, &children, &mut report);
    } else if ctype == "text" {
        let body = msg.body_text(0).map(|b| b.into_owned()).unwrap_or_default();
        if !ses(&body, &mut report) {
            plain(&msg, &body, &mut report);
        }
    }
    report.verp_candidates.dedup();
    report
}

/// Every value of a header (raw, unfolded), in order.
pub(super) fn header_values(msg: &Message, name: &str) -> Vec<String> {
    // Header offsets index the whole buffer the message was parsed from
    // (for an attached message: its parent's).
    let raw = &msg.raw_message;
    msg.parts[0]
        .headers
        .iter()
        .filter(|h| h.name().eq_ignore_ascii_case(name))
        .filter_map(|h| raw.get(h.offset_start as usize..h.offset_end as usize))
        .map(|v| unfold(&String::from_utf8_lossy(v)))
        .collect()
}

pub(super) fn unfold(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The subtype of a part's `message/…` or `text/…` content type.
pub(super) fn part_type(msg: &Message, id: usize) -> (String, String) {
    msg.parts
        .get(id)
        .and_then(|p| p.content_type())
        .map(|ct| {
            (
                ct.ctype().to_ascii_lowercase(),
                ct.subtype().unwrap_or("").to_ascii_lowercase(),
            )
        })
        .unwrap_or_default()
}

pub(super) fn has_part(msg: &Message, children: &[usize], subtype: &str) -> bool {
    children
        .iter()
        .any(|&id| part_type(msg, id).1.ends_with(subtype))
}

/// A part's body as text (report bodies are 7-bit; anything else is read
/// leniently).
pub(super) fn part_text(msg: &Message, id: usize) -> String {
    msg.parts
        .get(id)
        .map(|p| String::from_utf8_lossy(p.contents()).into_owned())
        .unwrap_or_default()
}

/// `Name: value` fields in groups separated by blank lines, continuation
/// lines unfolded; names lower-cased.
pub(super) fn field_groups(text: &str) -> Vec<Vec<(String, String)>> {
    let mut groups: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            if groups.last().is_some_and(|g| !g.is_empty()) {
                groups.push(Vec::new());
            }
            continue;
        }
        let Some(group) = groups.last_mut() else {
            continue;
        };
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = group.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((name, value)) = line.split_once(':') {
            group.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// A DSN address field: `rfc822; user@example.com` → the address.
pub(super) fn typed_address(value: &str) -> Option<String> {
    let addr = value.split_once(';').map_or(value, |(_, a)| a);
    addresses(addr).into_iter().next()
}

/// The headers of the reported message (a `message/rfc822` part or a
/// `text/rfc822-headers` one): Message-ID and Return-Path go into the
/// report; returns the parsed message for further looks.
pub(super) fn reported_message<'a>(
    msg: &'a Message<'a>,
    children: &[usize],
) -> Option<Message<'a>> {
    for &id in children {
        let part = msg.parts.get(id)?;
        match &part.body {
            PartType::Message(m) => return Some(m.clone()),
            PartType::Text(t) if part_type(msg, id).1.contains("rfc822-header") => {
                return MessageParser::default()
                    .parse(t.as_bytes())
                    .map(|m| m.into_owned());
            }
            _ => {}
        }
    }
    None
}

pub(super) fn note_reported(original: Option<&Message>, report: &mut ParsedReport) {
    let Some(original) = original else { return };
    if let Some(id) = original.message_id() {
        report.message_ids.push(id.to_string());
    }
    for value in header_values(original, "return-path") {
        report.verp_candidates.extend(addresses(&value));
    }
}

/// The email addresses in a text, in order: `user@example.com`,
/// `<user@example.com>`, `rfc822;user@example.com`.
pub fn addresses(text: &str) -> Vec<String> {
    let is_local = |c: char| c.is_ascii_alphanumeric() || "._%+-=!#$&'*/?^`{|}~".contains(c);
    let is_domain = |c: char| c.is_alphanumeric() || c == '.' || c == '-';
    let mut out: Vec<String> = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (k, &(at, c)) in chars.iter().enumerate() {
        if c != '@' {
            continue;
        }
        let mut start = at;
        for &(i, ch) in chars[..k].iter().rev() {
            if !is_local(ch) {
                break;
            }
            start = i;
        }
        let mut end = at + 1;
        for &(i, ch) in &chars[k + 1..] {
            if !is_domain(ch) {
                break;
            }
            end = i + ch.len_utf8();
        }
        let local = text[start..at].trim_start_matches(['.', '\'', '`']);
        let domain = text[at + 1..end].trim_end_matches(['.', '-']);
        if local.is_empty() || !domain.contains('.') || domain.starts_with('.') {
            continue;
        }
        let addr = format!("{local}@{domain}");
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_text() {
        assert_eq!(
            addresses("rfc822; a.b+c@Example.COM, <x@y.test>: z@nodot"),
            vec!["a.b+c@Example.COM", "x@y.test"]
        );
        assert_eq!(
            addresses("kijitora@example.jp."),
            vec!["kijitora@example.jp"]
        );
        assert!(addresses("no address here @ all").is_empty());
    }

    #[test]
    fn fields_unfold_and_group() {
        let groups = field_groups("A: 1\nB: two\n  lines\n\nC: 3\n");
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0][1], ("b".into(), "two lines".into()));
    }

    #[test]
    fn ordinary_mail_is_no_report() {
        let r =
            parse(b"From: a@b.test\r\nTo: c@d.test\r\nSubject: hi\r\n\r\nhello user@x.test\r\n");
        assert!(!r.is_report());
        assert!(parse(b"").findings.is_empty());
        assert!(parse(b"\x00\xff garbage").findings.is_empty());
    }
}
