//! Who a message says it is from and where its bounces go: the From
//! address, the VERP return path (`local+TOKEN@domain`), the signed
//! Message-ID, and reading both tokens back when a report arrives.

use std::str::FromStr;

use lettre::address::Envelope;
use lettre::message::Mailbox;
use lettre::Address;

use super::{dns_name, headers, on_the_wire, CampaignMail, ComposeError, Unsendable};
use crate::mail::Composed;
use crate::tokens::Identity;

/// Parse `--from`: a bare address or `Name <address>`.
pub fn parse_from(raw: &str) -> Result<Mailbox, ComposeError> {
    if raw.chars().any(char::is_control) {
        return Err(ComposeError::BadFrom(raw.to_string()));
    }
    let mailbox =
        Mailbox::from_str(raw.trim()).map_err(|_| ComposeError::BadFrom(raw.to_string()))?;
    // The domain must have an A-label: that is how it goes on the wire.
    on_the_wire(mailbox.clone()).map_err(|_| ComposeError::BadFrom(raw.to_string()))?;
    Ok(mailbox)
}

/// The From domain of a sender as DKIM keys are filed under and headers
/// name it: lower case, A-labels.
pub fn from_domain(from: &Mailbox) -> String {
    let domain = from.email.domain();
    dns_name(domain).unwrap_or_else(|| domain.to_ascii_lowercase())
}

/// Longest local part of a `--return-path`: the VERP token (up to 29
/// characters for campaigns below 2 million and recipients below 34
/// billion) and the `+` must still fit in 64 octets.
pub const MAX_RETURN_PATH_LOCAL: usize = 32;

/// Check `--return-path`: `local@domain`, the local part short enough for
/// `local+TOKEN` and free of `+` (Postfix splits the extension at the
/// first one). Returns the canonical spelling (domain folded).
pub fn parse_return_path(raw: &str) -> Result<String, ComposeError> {
    let bad = || ComposeError::BadReturnPath(raw.to_string());
    let addr = Address::from_str(raw.trim()).map_err(|_| bad())?;
    let local = addr.user();
    if local.len() > MAX_RETURN_PATH_LOCAL
        || local.contains('+')
        || local.starts_with('"')
        || raw.chars().any(char::is_control)
    {
        return Err(bad());
    }
    Ok(format!("{local}@{}", addr.domain().to_lowercase()))
}

/// A campaign's VERP return path, `local@domain`: each message's envelope
/// sender is `local+TOKEN@domain`, TOKEN naming campaign and recipient
/// under the database's secret (see [`envelope_sender`]).
#[derive(Debug, Clone)]
pub struct Verp {
    local: String,
    domain: String,
}

impl Verp {
    pub(super) fn parse(raw: &str) -> Result<Verp, ComposeError> {
        let canonical = parse_return_path(raw)?;
        let (local, domain) = canonical
            .rsplit_once('@')
            .ok_or_else(|| ComposeError::BadReturnPath(raw.to_string()))?;
        Ok(Verp {
            local: local.to_string(),
            domain: domain.to_string(),
        })
    }
}

/// The envelope sender (MAIL FROM, where bounces go) of one recipient's
/// message: the campaign's VERP address for this recipient, or the From
/// address when the campaign has no return path. The From header is never
/// changed.
pub fn envelope_sender(campaign: &CampaignMail, recipient_id: i64) -> Address {
    campaign
        .verp
        .as_ref()
        .and_then(|v| {
            let token = campaign
                .identity
                .signer
                .verp_token(campaign.id, recipient_id);
            Address::new(format!("{}+{token}", v.local), &v.domain).ok()
        })
        .unwrap_or_else(|| campaign.from.email.clone())
}

impl Verp {
    /// `local+TOKEN@domain` for transactional message `message` (see
    /// [`crate::tokens::Signer::message_verp_token`]).
    pub(super) fn for_message(&self, identity: &Identity, message: i64) -> Option<Address> {
        let token = identity.signer.message_verp_token(message);
        Address::new(format!("{}+{token}", self.local), &self.domain).ok()
    }
}

/// The message with `sender` as its envelope sender (the headers stay as
/// they are: the From header is the campaign's).
pub(super) fn with_sender(mut message: Composed, sender: Address) -> Result<Composed, Unsendable> {
    message.envelope = Envelope::new(Some(sender), message.envelope.to().to_vec())
        .map_err(|e| Unsendable::Invalid(format!("cannot build the envelope: {e}")))?;
    Ok(message)
}

/// The (campaign, recipient) a Message-ID of this database's messages
/// names (see [`headers::message_id`]); `None` for anyone else's and for
/// every made-up one: the token in it is an HMAC under the database's
/// secret. The sequential ids of older versions (`<C.R.db-…@…>`) are not
/// read: anybody could write one.
pub fn read_message_id(id: &str, identity: &Identity) -> Option<(i64, i64)> {
    let id = id.trim().trim_start_matches('<').trim_end_matches('>');
    let (local, _) = id.rsplit_once('@')?;
    let (token, _database) = local.split_once('.')?;
    identity.signer.read_message_id_token(token)
}

/// The Message-ID of one campaign's message to one recipient.
pub fn message_id_of(identity: &Identity, campaign: i64, recipient: i64, domain: &str) -> String {
    let token = identity.signer.message_id_token(campaign, recipient);
    headers::message_id(&token, &identity.database_id, domain)
}
