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

use super::classify;
use crate::mail::Enhanced;
use crate::store::bounces::BounceKind;

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
fn header_values(msg: &Message, name: &str) -> Vec<String> {
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

fn unfold(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The subtype of a part's `message/…` or `text/…` content type.
fn part_type(msg: &Message, id: usize) -> (String, String) {
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

fn has_part(msg: &Message, children: &[usize], subtype: &str) -> bool {
    children
        .iter()
        .any(|&id| part_type(msg, id).1.ends_with(subtype))
}

/// A part's body as text (report bodies are 7-bit; anything else is read
/// leniently).
fn part_text(msg: &Message, id: usize) -> String {
    msg.parts
        .get(id)
        .map(|p| String::from_utf8_lossy(p.contents()).into_owned())
        .unwrap_or_default()
}

/// `Name: value` fields in groups separated by blank lines, continuation
/// lines unfolded; names lower-cased.
fn field_groups(text: &str) -> Vec<Vec<(String, String)>> {
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
fn typed_address(value: &str) -> Option<String> {
    let addr = value.split_once(';').map_or(value, |(_, a)| a);
    addresses(addr).into_iter().next()
}

/// The headers of the reported message (a `message/rfc822` part or a
/// `text/rfc822-headers` one): Message-ID and Return-Path go into the
/// report; returns the parsed message for further looks.
fn reported_message<'a>(msg: &'a Message<'a>, children: &[usize]) -> Option<Message<'a>> {
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

fn note_reported(original: Option<&Message>, report: &mut ParsedReport) {
    let Some(original) = original else { return };
    if let Some(id) = original.message_id() {
        report.message_ids.push(id.to_string());
    }
    for value in header_values(original, "return-path") {
        report.verp_candidates.extend(addresses(&value));
    }
}

/// RFC 3464: one finding per failed or delayed recipient.
fn dsn(msg: &Message, children: &[usize], report: &mut ParsedReport) {
    report.format = "dsn";
    let original = reported_message(msg, children);
    note_reported(original.as_ref(), report);
    for &id in children {
        if !part_type(msg, id).1.ends_with("delivery-status") {
            continue;
        }
        let text = part_text(msg, id);
        // Per-message fields, then one group per recipient; some MTAs (AOL)
        // leave out the blank line, so a recipient group also starts where
        // a recipient field repeats.
        let mut recipients: Vec<Vec<(String, String)>> = Vec::new();
        for group in field_groups(&text) {
            let mut current: Vec<(String, String)> = Vec::new();
            for (name, value) in group {
                if name == "x-postfix-sender" || name == "x-outbound-mail-relay-sender" {
                    report.verp_candidates.extend(typed_address(&value));
                }
                let repeats = |n: &str| current.iter().any(|(k, _)| k == n);
                if (name == "final-recipient" || name == "original-recipient") && repeats(&name) {
                    recipients.push(std::mem::take(&mut current));
                }
                current.push((name, value));
            }
            if current.iter().any(|(k, _)| k.ends_with("-recipient")) {
                recipients.push(current);
            }
        }
        for fields in recipients {
            if let Some(f) = dsn_finding(&fields) {
                report.findings.push(f);
            }
        }
    }
}

fn dsn_finding(fields: &[(String, String)]) -> Option<Finding> {
    let get = |n: &str| fields.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let address = get("final-recipient")
        .or(get("original-recipient"))
        .and_then(typed_address);
    let status = get("status").and_then(Enhanced::parse);
    let diagnostic = get("diagnostic-code")
        .map(|d| d.split_once(';').map_or(d, |(_, t)| t).trim())
        .unwrap_or("");
    let action = get("action").unwrap_or("").to_ascii_lowercase();
    let failed = match action.split_whitespace().next().unwrap_or("") {
        "failed" => true,
        "delayed" => false,
        // delivered, relayed, expanded: nothing went wrong.
        "" => status.is_some_and(|s| s.class == 5),
        _ => return None,
    };
    let reason = if diagnostic.is_empty() {
        get("status").unwrap_or("").to_string()
    } else {
        diagnostic.to_string()
    };
    let (kind, code) = if failed {
        classify::failure(status, diagnostic)
    } else {
        (BounceKind::Delayed, status)
    };
    Some(Finding {
        address,
        kind,
        status: code.map(|c| c.to_string()),
        reason,
    })
}

/// RFC 5965 (and the older ARF drafts): one finding per reported recipient.
fn arf(msg: &Message, children: &[usize], report: &mut ParsedReport) {
    report.format = "arf";
    let original = reported_message(msg, children);
    note_reported(original.as_ref(), report);
    let mut fields = Vec::new();
    for &id in children {
        if part_type(msg, id).1.ends_with("feedback-report") {
            fields.extend(field_groups(&part_text(msg, id)).into_iter().flatten());
        }
    }
    let values = |n: &str| -> Vec<&str> {
        fields
            .iter()
            .filter(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    for from in values("original-mail-from") {
        report.verp_candidates.extend(addresses(from));
    }
    let feedback = values("feedback-type")
        .first()
        .map(|t| t.to_ascii_lowercase())
        .unwrap_or_else(|| "abuse".into());
    let kind = match feedback.as_str() {
        "abuse" | "fraud" | "virus" => BounceKind::Complaint,
        _ => BounceKind::Feedback,
    };
    let mut rcpts: Vec<String> = values("original-rcpt-to")
        .into_iter()
        .chain(values("removal-recipient"))
        .flat_map(addresses)
        .collect();
    if rcpts.is_empty() {
        // Redacted reports keep only the reported message's To.
        if let Some(original) = &original {
            rcpts = header_values(original, "to")
                .iter()
                .flat_map(|v| addresses(v))
                .collect();
        }
    }
    let reason = format!("{feedback} report");
    report.findings.extend(rcpts.into_iter().map(|a| Finding {
        address: Some(a),
        kind,
        status: Some(feedback.clone()),
        reason: reason.clone(),
    }));
}

/// Microsoft's JMRP: the complained-about message attached whole, its
/// recipient in `X-HmXmrOriginalRecipient`.
fn jmrp(msg: &Message, children: &[usize], report: &mut ParsedReport) {
    for &id in children {
        let Some(PartType::Message(original)) = msg.parts.get(id).map(|p| &p.body) else {
            continue;
        };
        let rcpts = header_values(original, "x-hmxmroriginalrecipient");
        if rcpts.is_empty() {
            continue;
        }
        report.format = "jmrp";
        note_reported(Some(original), report);
        report
            .findings
            .extend(rcpts.iter().flat_map(|v| addresses(v)).map(|a| Finding {
                address: Some(a),
                kind: BounceKind::Complaint,
                status: Some("abuse".into()),
                reason: "abuse report (JMRP)".into(),
            }));
    }
}

/// Amazon SES notifications delivered as mail (SNS): a JSON body with
/// `notificationType` Complaint or Bounce.
pub fn ses(body: &str, report: &mut ParsedReport) -> bool {
    let Some(start) = body.find('{') else {
        return false;
    };
    let Some(end) = body.rfind('}') else {
        return false;
    };
    // Mail transports break lines over 990 characters with "!" CRLF SP.
    let json = body[start..=end].replace("!\r\n ", "").replace("!\n ", "");
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&json) else {
        return false;
    };
    // SNS wraps the notification as a string in `Message`.
    let value = match value.get("Message").and_then(|m| m.as_str()) {
        Some(inner) => serde_json::from_str(inner).unwrap_or(value),
        None => value,
    };
    let get =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let (kind_of, list, status_key, reason_key) = match get(&value, "notificationType")
        .or_else(|| get(&value, "eventType"))
        .as_deref()
    {
        Some("Complaint") => ("complaint", "complainedRecipients", "", ""),
        Some("Bounce") => ("bounce", "bouncedRecipients", "status", "diagnosticCode"),
        _ => return false,
    };
    let inner = value.get(kind_of).cloned().unwrap_or_default();
    let bounce_type = get(&inner, "bounceType").unwrap_or_default();
    let feedback = get(&inner, "complaintFeedbackType").unwrap_or_else(|| "abuse".into());
    report.format = "ses";
    for r in inner
        .get(list)
        .and_then(|l| l.as_array())
        .cloned()
        .unwrap_or_default()
    {
        let Some(address) = get(&r, "emailAddress").and_then(|a| addresses(&a).into_iter().next())
        else {
            continue;
        };
        let finding = if kind_of == "complaint" {
            Finding {
                address: Some(address),
                kind: BounceKind::Complaint,
                status: Some(feedback.clone()),
                reason: format!("{feedback} complaint (SES)"),
            }
        } else {
            let status = get(&r, status_key).and_then(|s| Enhanced::parse(&s));
            let diagnostic = get(&r, reason_key).unwrap_or_default();
            let (kind, code) = match bounce_type.as_str() {
                "Transient" => (BounceKind::Soft, status),
                _ => classify::failure(status, &diagnostic),
            };
            Finding {
                address: Some(address),
                kind,
                status: code.map(|c| c.to_string()),
                reason: diagnostic,
            }
        };
        report.findings.push(finding);
    }
    true
}

/// Where a plain-text bounce stops reporting and starts quoting the
/// returned message.
const QUOTE_MARKERS: &[&str] = &[
    "--- below this line is a copy of the message",
    "------ this is a copy of the message",
    "----- original message -----",
    "original message follows",
    "----- transcript of session follows",
    "------ this is a copy of your message",
];
/// Phrases of a plain-text failure report.
const FAILURE_PHRASES: &[&str] = &[
    "could not be delivered",
    "following address(es) failed",
    "failed permanently",
    "unable to deliver",
    "wasn't able to deliver",
    "did not reach the following recipient",
    "delivery has failed",
    "undeliverable",
    "permanent error",
];
/// Phrases of a warning: still retrying.
const DELAY_PHRASES: &[&str] = &[
    "has been delayed",
    "has not yet been delivered",
    "warning message only",
    "will be retried",
    "delivery attempts will continue",
];

/// Plain-text bounces: from a mailer daemon (or carrying
/// `X-Failed-Recipients`), with a failure or delay phrase; the failed
/// addresses are the ones the report part names that are not the bounce's
/// own sender or addressee.
fn plain(msg: &Message, body: &str, report: &mut ParsedReport) {
    let from = header_values(msg, "from").join(" ").to_lowercase();
    let failed_header: Vec<String> = header_values(msg, "x-failed-recipients")
        .iter()
        .flat_map(|v| addresses(v))
        .collect();
    let daemon = [
        "mailer-daemon",
        "postmaster",
        "mail delivery",
        "mail-daemon",
    ]
    .iter()
    .any(|d| from.contains(d));
    if !daemon && failed_header.is_empty() {
        return;
    }
    let lower = body.to_lowercase();
    let end = QUOTE_MARKERS
        .iter()
        .filter_map(|m| lower.find(m))
        .min()
        .unwrap_or(body.len());
    let head = &body[..floor_char_boundary(body, end)];
    let head_lower = head.to_lowercase();
    let subject = header_values(msg, "subject").join(" ").to_lowercase();
    let delayed = DELAY_PHRASES.iter().any(|p| head_lower.contains(p))
        || subject.contains("(delay)")
        || (subject.starts_with("warning:") && subject.contains("delayed"));
    let failed = FAILURE_PHRASES.iter().any(|p| head_lower.contains(p));
    if !delayed && !failed && failed_header.is_empty() {
        return;
    }
    report.format = "plain";
    // The bounce's own parties are never the failed recipient (a quoted
    // "To:" line in the summary is the original sender).
    let own: Vec<String> = [
        "from",
        "to",
        "return-path",
        "delivered-to",
        "x-original-to",
        "envelope-to",
    ]
    .iter()
    .flat_map(|h| header_values(msg, h))
    .flat_map(|v| addresses(&v))
    .map(|a| a.to_lowercase())
    .collect();
    let mut rcpts = failed_header;
    if rcpts.is_empty() {
        rcpts = addresses(head)
            .into_iter()
            .filter(|a| {
                let l = a.to_lowercase();
                !own.contains(&l)
                    && !l.starts_with("mailer-daemon@")
                    && !l.starts_with("postmaster@")
            })
            .collect();
        rcpts.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    }
    let diagnostic = unfold(head);
    let (kind, code) = if delayed {
        (BounceKind::Delayed, classify::enhanced_in(head))
    } else {
        classify::failure(None, head)
    };
    let reason = diagnostic_line(head).unwrap_or_else(|| one_line_prefix(&diagnostic, 300));
    let status = code.map(|c| c.to_string());
    if rcpts.is_empty() {
        report.findings.push(Finding {
            address: None,
            kind,
            status,
            reason,
        });
        return;
    }
    report.findings.extend(rcpts.into_iter().map(|a| Finding {
        address: Some(a),
        kind,
        status: status.clone(),
        reason: reason.clone(),
    }));
}

/// The line of a plain report that carries the remote server's answer.
fn diagnostic_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| {
            l.split_whitespace().next().is_some_and(|w| {
                w.len() >= 3 && w[..3].parse::<u16>().is_ok_and(|c| (400..600).contains(&c))
            }) || classify::enhanced_in(l).is_some()
        })
        .map(|l| one_line_prefix(l, 300))
}

fn one_line_prefix(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
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
