//! Plain-text bounces (qmail, Exim, Exchange, Gmail, Yahoo): no
//! machine-readable part, only phrasing and addresses.

use mail_parser::Message;

use super::{addresses, header_values, unfold, Finding, ParsedReport};
use crate::bounce::classify;
use crate::store::bounces::BounceKind;

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
pub(super) fn plain(msg: &Message, body: &str, report: &mut ParsedReport) {
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
    let head = report_head(body);
    let head_lower = head.to_lowercase();
    let delayed = is_delay(msg, &head_lower);
    let failed = FAILURE_PHRASES.iter().any(|p| head_lower.contains(p));
    if !delayed && !failed && failed_header.is_empty() {
        return;
    }
    report.format = "plain";
    let rcpts = failed_recipients(msg, head, failed_header);
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

/// The part of a plain report before it starts quoting the returned
/// message.
fn report_head(body: &str) -> &str {
    let lower = body.to_lowercase();
    let end = QUOTE_MARKERS
        .iter()
        .filter_map(|m| lower.find(m))
        .min()
        .unwrap_or(body.len());
    &body[..floor_char_boundary(body, end)]
}

/// A warning that delivery is still being tried, by its phrasing or subject.
fn is_delay(msg: &Message, head_lower: &str) -> bool {
    let subject = header_values(msg, "subject").join(" ").to_lowercase();
    DELAY_PHRASES.iter().any(|p| head_lower.contains(p))
        || subject.contains("(delay)")
        || (subject.starts_with("warning:") && subject.contains("delayed"))
}

/// The failed recipients: `X-Failed-Recipients` when given, else the
/// addresses the report part names.
fn failed_recipients(msg: &Message, head: &str, failed_header: Vec<String>) -> Vec<String> {
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
    rcpts
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
