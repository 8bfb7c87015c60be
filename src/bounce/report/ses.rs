//! Amazon SES notifications that arrive as mail: a JSON body.

use super::{addresses, Finding, ParsedReport};
use crate::bounce::classify;
use crate::mail::Enhanced;
use crate::store::bounces::BounceKind;

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
