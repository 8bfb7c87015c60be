//! Amazon SES notifications that arrive as mail: a JSON body.

use super::{addresses, Finding, ParsedReport};
use crate::bounce::classify;
use crate::mail::Enhanced;
use crate::store::bounces::BounceKind;
use serde_json::Value;

/// Amazon SES notifications delivered as mail (SNS): a JSON body with
/// `notificationType` Complaint or Bounce.
pub fn ses(body: &str, report: &mut ParsedReport) -> bool {
    let Some(value) = notification(body) else {
        return false;
    };
    let kind_of = match text(&value, "notificationType")
        .or_else(|| text(&value, "eventType"))
        .as_deref()
    {
        Some("Complaint") => "complaint",
        Some("Bounce") => "bounce",
        _ => return false,
    };
    let list = if kind_of == "complaint" {
        "complainedRecipients"
    } else {
        "bouncedRecipients"
    };
    let inner = value.get(kind_of).cloned().unwrap_or_default();
    report.format = "ses";
    for r in inner
        .get(list)
        .and_then(|l| l.as_array())
        .cloned()
        .unwrap_or_default()
    {
        let Some(address) = text(&r, "emailAddress").and_then(|a| addresses(&a).into_iter().next())
        else {
            continue;
        };
        let finding = if kind_of == "complaint" {
            complaint(&inner, address)
        } else {
            bounce(&inner, &r, address)
        };
        report.findings.push(finding);
    }
    true
}

/// The notification's JSON object in a mail body, unwrapped from SNS's
/// envelope when it has one.
fn notification(body: &str) -> Option<Value> {
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    // Mail transports break lines over 990 characters with "!" CRLF SP.
    let json = body[start..=end].replace("!\r\n ", "").replace("!\n ", "");
    let value = serde_json::from_str::<Value>(&json).ok()?;
    // SNS wraps the notification as a string in `Message`.
    Some(match value.get("Message").and_then(|m| m.as_str()) {
        Some(inner) => serde_json::from_str(inner).unwrap_or(value),
        None => value,
    })
}

/// A string field of a JSON object.
fn text(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(|x| x.as_str()).map(str::to_string)
}

/// A complained recipient: the feedback type is the status.
fn complaint(inner: &Value, address: String) -> Finding {
    let feedback = text(inner, "complaintFeedbackType").unwrap_or_else(|| "abuse".into());
    Finding {
        address: Some(address),
        kind: BounceKind::Complaint,
        reason: format!("{feedback} complaint (SES)"),
        status: Some(feedback),
    }
}

/// A bounced recipient `r`: SES's `Transient` is soft whatever the code.
fn bounce(inner: &Value, r: &Value, address: String) -> Finding {
    let status = text(r, "status").and_then(|s| Enhanced::parse(&s));
    let diagnostic = text(r, "diagnosticCode").unwrap_or_default();
    let (kind, code) = match text(inner, "bounceType").as_deref() {
        Some("Transient") => (BounceKind::Soft, status),
        _ => classify::failure(status, &diagnostic),
    };
    Finding {
        address: Some(address),
        kind,
        status: code.map(|c| c.to_string()),
        reason: diagnostic,
    }
}
