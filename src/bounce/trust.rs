//! Whom a report may change: only what we wrote ourselves is believed.
//! A report is matched to one recipient by a token only this database
//! could have made (an HMAC under its secret):
//!
//! 1. the VERP token of the address the report was delivered to, or of
//!    the reported message's envelope sender (`bounces+TOKEN@…`, only on
//!    campaigns with `--return-path`): it names campaign and recipient;
//! 2. else the token in the reported message's Message-ID (every message
//!    has one), believed only when the ledger says that campaign's message
//!    to that recipient was `sent`.
//!
//! One verified token changes one recipient, the one it names, whatever
//! addresses the report lists. A report with no such token (a forgery, a
//! made-up token, a report about a message of an older version or of
//! somebody else) changes nobody: the caller records it as unverified.

use super::report::{Finding, ParsedReport as Report};
use crate::compose;
use crate::store::bounces::{self, BounceKind};
use crate::store::{campaigns, Conn, StoreError};
use crate::tokens::Identity;

/// A finding matched to one of our recipients by a verified token.
pub(super) struct Target {
    pub recipient_id: i64,
    pub email: String,
    pub campaign_id: Option<i64>,
    pub finding: Finding,
}

/// The one recipient a report is about, or why none can be believed.
pub(super) fn resolve(
    conn: &mut Conn,
    identity: &Identity,
    report: &Report,
    envelope: Option<&str>,
) -> Result<Result<Target, String>, StoreError> {
    let candidates: Vec<&str> = envelope
        .into_iter()
        .chain(report.verp_candidates.iter().map(String::as_str))
        .collect();
    if let Some((campaign, recipient)) = candidates.iter().find_map(|a| read_verp(identity, a)) {
        if let Some(target) = target(conn, report, campaign, recipient)? {
            return Ok(Ok(target));
        }
    }
    let mut never_sent = None;
    for id in &report.message_ids {
        let Some((campaign, recipient)) = compose::read_message_id(id, identity) else {
            continue;
        };
        if !bounces::was_sent(conn, campaign, recipient)? {
            never_sent = Some((campaign, recipient));
            continue;
        }
        if let Some(target) = target(conn, report, campaign, recipient)? {
            return Ok(Ok(target));
        }
    }
    let tokened = candidates.iter().any(|a| verp_token_of(a).is_some());
    Ok(Err(match never_sent {
        Some((c, r)) => format!(
            "its Message-ID names campaign {c}'s message to recipient {r}, which the ledger never sent"
        ),
        None if tokened => {
            "its VERP token is not one we made (forged, or another database's)".into()
        }
        None if !report.message_ids.is_empty() => {
            "no VERP token, and its Message-ID is not one of ours".into()
        }
        None => "it carries neither a VERP token nor a Message-ID of ours".into(),
    }))
}

/// The recipient a verified token names, with the finding about them: the
/// one naming their address, else the most serious one.
fn target(
    conn: &mut Conn,
    report: &Report,
    campaign: i64,
    recipient: i64,
) -> Result<Option<Target>, StoreError> {
    let Some(r) = crate::store::recipients::load(conn, &[recipient])?.pop() else {
        return Ok(None);
    };
    let Some(finding) = finding_about(report, &r.email) else {
        return Ok(None);
    };
    Ok(Some(Target {
        recipient_id: r.id,
        email: r.email,
        campaign_id: campaigns::get(conn, campaign)?.map(|c| c.id),
        finding,
    }))
}

/// The finding about `email`: the one naming that mailbox, else the most
/// serious one.
pub(super) fn finding_about(report: &Report, email: &str) -> Option<Finding> {
    let key = crate::mailbox::key(email).ok();
    report
        .findings
        .iter()
        .find(|f| {
            f.address
                .as_deref()
                .and_then(|a| crate::mailbox::key(a).ok())
                .is_some_and(|k| Some(k) == key)
        })
        .or_else(|| report.findings.iter().max_by_key(|f| severity(f.kind)))
        .cloned()
}

/// How much a finding weighs when one has to be picked.
pub(super) fn severity(kind: BounceKind) -> u8 {
    match kind {
        BounceKind::Complaint => 5,
        BounceKind::Hard => 4,
        BounceKind::Policy => 3,
        BounceKind::Soft => 2,
        BounceKind::Feedback => 1,
        BounceKind::Delayed => 0,
    }
}

/// The transactional message a genuine message VERP token among the
/// report's addresses names (see [`super::message`]).
pub(super) fn message_of(
    identity: &Identity,
    report: &Report,
    envelope: Option<&str>,
) -> Option<i64> {
    envelope
        .into_iter()
        .chain(report.verp_candidates.iter().map(String::as_str))
        .find_map(|a| identity.signer.read_message_verp(verp_token_of(a)?))
}

/// The token of an address `local+TOKEN@domain`, genuine or not.
fn verp_token_of(address: &str) -> Option<&str> {
    let address = address.trim().trim_start_matches('<').trim_end_matches('>');
    let (local, _) = address.rsplit_once('@')?;
    let (_, token) = local.split_once('+')?;
    Some(token)
}

/// The (campaign, recipient) of an address `local+TOKEN@domain` whose
/// token is genuine.
pub fn read_verp(identity: &Identity, address: &str) -> Option<(i64, i64)> {
    identity.signer.read_verp(verp_token_of(address)?)
}
