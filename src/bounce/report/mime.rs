//! The standard MIME report formats: RFC 3464 delivery status
//! notifications, RFC 5965 ARF feedback reports and Microsoft's JMRP.

use mail_parser::{Message, PartType};

use super::{
    addresses, field_groups, header_values, note_reported, part_text, part_type, reported_message,
    typed_address, Finding, ParsedReport,
};
use crate::bounce::classify;
use crate::mail::Enhanced;
use crate::store::bounces::BounceKind;

/// RFC 3464: one finding per failed or delayed recipient.
pub(super) fn dsn(msg: &Message, children: &[usize], report: &mut ParsedReport) {
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
pub(super) fn arf(msg: &Message, children: &[usize], report: &mut ParsedReport) {
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
pub(super) fn jmrp(msg: &Message, children: &[usize], report: &mut ParsedReport) {
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
