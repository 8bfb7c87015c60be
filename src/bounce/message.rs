//! Reports about a transactional message (see [`crate::messages`]): its
//! envelope sender was `local+TOKEN@domain`, TOKEN naming the message
//! under the database's secret (`template create --return-path`). The
//! message turns `bounced` when the report says it did not arrive; the
//! address then gets no more mail: a recipient on file is changed as a
//! campaign's report changes them (hard bounce, complaint), and an address
//! that is on no list goes on the suppression list, since the
//! transactional stream is checked against both.

use super::report::{Finding, ParsedReport as Report};
use super::{finding_action, trust, Settings};
use crate::store::bounces::{self, BounceKind, BounceSource, NewBounce};
use crate::store::{messages, now_ms, recipients, suppressions, Conn, StoreError};

/// What one report did to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageApplied {
    pub message_id: i64,
    pub email: String,
    pub kind: BounceKind,
    pub status: Option<String>,
    /// True when this report turned the message `bounced` (false: it
    /// was not `sent`, or a report said so before).
    pub bounced: bool,
    /// What became of the address: the recipient's new status, or
    /// `suppressed` for an address on no list; `None` when unchanged.
    pub address_now: Option<String>,
}

/// Record a report about message `message` (named by a genuine token);
/// `None` when there is no such message (removed since).
pub(super) fn record(
    conn: &mut Conn,
    message: i64,
    report: &Report,
    fingerprint: &str,
    settings: &Settings,
) -> Result<Option<MessageApplied>, StoreError> {
    let Some(m) = messages::find(conn, message)? else {
        return Ok(None);
    };
    let email = m
        .to_addr
        .parse::<lettre::message::Mailbox>()
        .map(|to| to.email.to_string())
        .unwrap_or_else(|_| m.to_addr.clone());
    let Some(f) = trust::finding_about(report, &email) else {
        return Ok(None);
    };
    let bounced = match f.kind {
        // It did not arrive.
        BounceKind::Hard | BounceKind::Soft | BounceKind::Policy => {
            let why = format!(
                "{} bounce ({}): {}{}",
                f.kind,
                report.format,
                f.status
                    .as_deref()
                    .map(|s| format!("{s} "))
                    .unwrap_or_default(),
                f.reason
            );
            messages::bounced(conn, m.id, &why, now_ms())?
        }
        BounceKind::Complaint | BounceKind::Feedback | BounceKind::Delayed => false,
    };
    let address_now = mark_address(conn, &email, &f, (report, fingerprint), settings)?;
    Ok(Some(MessageApplied {
        message_id: m.id,
        email,
        kind: f.kind,
        status: f.status.clone(),
        bounced,
        address_now,
    }))
}

/// The address's fate after finding `f`: a recipient on file takes the
/// event as a campaign's report would give it; a stranger who bounced
/// hard or complained is suppressed.
fn mark_address(
    conn: &mut Conn,
    email: &str,
    f: &Finding,
    (report, fingerprint): (&Report, &str),
    settings: &Settings,
) -> Result<Option<String>, StoreError> {
    let action = finding_action(f, report, settings);
    if let Some(recipient_id) = recipients::find_by_email(conn, email)? {
        let done = bounces::record(
            conn,
            &NewBounce {
                recipient_id,
                campaign_id: None,
                email: f.address.as_deref().unwrap_or(email),
                kind: f.kind,
                status: f.status.as_deref(),
                reason: &f.reason,
                source: BounceSource::Report,
                fingerprint,
            },
            &action,
        )?;
        return Ok(done.changed_to.map(|s| s.as_str().to_string()));
    }
    if !matches!(f.kind, BounceKind::Hard | BounceKind::Complaint) {
        return Ok(None);
    }
    let Some(entry) = suppressions::entry_of(email) else {
        return Ok(None);
    };
    let reason = format!("{} ({}) of a transactional message", f.kind, report.format);
    let added = suppressions::add(conn, &[entry], &reason, now_ms())?;
    Ok((added > 0).then(|| "suppressed".to_string()))
}
