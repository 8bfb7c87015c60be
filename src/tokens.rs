//! Tokens signed with the database's secret (see `store::installation`):
//! the signature on every job body, one-click unsubscribe tokens, VERP
//! return-path tokens and the tokens in our Message-IDs. Each purpose has its own label inside the MAC, so a
//! token made for one purpose is never valid for another, and every check
//! compares in constant time. Nothing here touches the database.

use std::sync::LazyLock;

use data_encoding::{Encoding, Specification, BASE64URL_NOPAD};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::store::Installation;

mod link;
pub use link::MessageLinks;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of MAC kept in a job signature (128 bits).
const JOB_MAC_BYTES: usize = 16;
/// Bytes of MAC in an unsubscribe token (96 bits: unguessable, and the
/// token stays about 22 characters).
const UNSUBSCRIBE_MAC_BYTES: usize = 12;
/// Bytes of MAC in a VERP token (80 bits): base32 makes 16 characters of
/// it, so `bounces+TOKEN` stays far under the 64-octet local-part limit.
const VERP_MAC_BYTES: usize = 10;
/// Bytes of MAC in a Message-ID token (96 bits): a bounce or complaint that
/// quotes the Message-ID is believed only if nobody could have made it up.
const MESSAGE_ID_MAC_BYTES: usize = 12;
/// Bytes of MAC in an open or click token (96 bits), as unsubscribe tokens.
const TRACKING_MAC_BYTES: usize = 12;

/// Lower-case base32 without padding: what survives Postfix lower-casing
/// `${extension}` in a VERP address.
static BASE32_LOWER: LazyLock<Encoding> = LazyLock::new(|| {
    let mut spec = Specification::new();
    spec.symbols.push_str("abcdefghijklmnopqrstuvwxyz234567");
    spec.encoding()
        .unwrap_or_else(|_| data_encoding::BASE32_NOPAD.clone())
});

/// Makes and checks every token of one database.
#[derive(Clone)]
pub struct Signer {
    key: HmacSha256,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<redacted>)")
    }
}

/// What a job or a token is for; part of every MAC.
#[derive(Clone, Copy)]
enum Purpose {
    Job,
    Unsubscribe,
    Verp,
    MessageVerp,
    MessageId,
    Open,
    Click,
    TemplateLink,
    Confirm,
    Preferences,
    View,
    MessageOpen,
    MessageLink,
    MessagePreferences,
    MessageView,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Job => b"mailsplit job v2\0",
            Purpose::Unsubscribe => b"mailsplit unsubscribe\0",
            Purpose::Verp => b"mailsplit verp\0",
            Purpose::MessageVerp => b"mailsplit message verp\0",
            Purpose::MessageId => b"mailsplit message-id\0",
            Purpose::Open => b"mailsplit open\0",
            Purpose::Click => b"mailsplit click\0",
            Purpose::TemplateLink => b"mailsplit template link\0",
            Purpose::Confirm => b"mailsplit confirm\0",
            Purpose::Preferences => b"mailsplit preferences\0",
            Purpose::View => b"mailsplit view\0",
            Purpose::MessageOpen => b"mailsplit message open\0",
            Purpose::MessageLink => b"mailsplit message link\0",
            Purpose::MessagePreferences => b"mailsplit message preferences\0",
            Purpose::MessageView => b"mailsplit message view\0",
        }
    }
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer {
            // HMAC takes a key of any length.
            key: HmacSha256::new_from_slice(secret)
                .unwrap_or_else(|_| HmacSha256::new_from_slice(&[0]).expect("HMAC key")),
        }
    }

    fn mac(&self, purpose: Purpose, data: &[u8]) -> HmacSha256 {
        let mut mac = self.key.clone();
        mac.update(purpose.label());
        mac.update(data);
        mac
    }

    fn tag(&self, purpose: Purpose, data: &[u8], len: usize) -> Vec<u8> {
        self.mac(purpose, data).finalize().into_bytes()[..len].to_vec()
    }

    fn verify(&self, purpose: Purpose, data: &[u8], tag: &[u8]) -> bool {
        // `verify_truncated_left` compares in constant time; an empty tag
        // would verify trivially, so refuse it first.
        !tag.is_empty() && self.mac(purpose, data).verify_truncated_left(tag).is_ok()
    }

    /// The signature of a job body: over the database id, the campaign and
    /// every recipient id, in order.
    pub fn job_mac(&self, database_id: &str, campaign: i64, recipients: &[i64]) -> String {
        let data = job_bytes(database_id, campaign, recipients);
        BASE64URL_NOPAD.encode(&self.tag(Purpose::Job, &data, JOB_MAC_BYTES))
    }

    pub fn verify_job(
        &self,
        database_id: &str,
        campaign: i64,
        recipients: &[i64],
        mac: &str,
    ) -> bool {
        let Ok(tag) = BASE64URL_NOPAD.decode(mac.as_bytes()) else {
            return false;
        };
        tag.len() == JOB_MAC_BYTES
            && self.verify(
                Purpose::Job,
                &job_bytes(database_id, campaign, recipients),
                &tag,
            )
    }

    /// The token of a one-click unsubscribe link (`/u/TOKEN`): URL-safe,
    /// about 22 characters.
    pub fn unsubscribe_token(&self, campaign: i64, recipient: i64) -> String {
        BASE64URL_NOPAD.encode(&self.pair_token(
            Purpose::Unsubscribe,
            campaign,
            recipient,
            UNSUBSCRIBE_MAC_BYTES,
        ))
    }

    /// The token of a sign-up's confirmation link (`/confirm/TOKEN`):
    /// the sign-up's id and when it was made (ms), so an old link is
    /// known without the database.
    pub fn confirm_token(&self, signup: i64, created_at: i64) -> String {
        BASE64URL_NOPAD.encode(&self.pair_token(
            Purpose::Confirm,
            signup,
            created_at,
            UNSUBSCRIBE_MAC_BYTES,
        ))
    }

    /// The (sign-up, created at) of a genuine confirmation token.
    pub fn read_confirm(&self, token: &str) -> Option<(i64, i64)> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        self.read_pair(Purpose::Confirm, &raw, UNSUBSCRIBE_MAC_BYTES)
    }

    /// The token of a recipient's preference centre (`/p/TOKEN`), made
    /// for one campaign's message to them, as unsubscribe tokens are.
    pub fn preferences_token(&self, campaign: i64, recipient: i64) -> String {
        BASE64URL_NOPAD.encode(&self.pair_token(
            Purpose::Preferences,
            campaign,
            recipient,
            UNSUBSCRIBE_MAC_BYTES,
        ))
    }

    /// The (campaign, recipient) of a genuine preferences token.
    pub fn read_preferences(&self, token: &str) -> Option<(i64, i64)> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        self.read_pair(Purpose::Preferences, &raw, UNSUBSCRIBE_MAC_BYTES)
    }

    /// The token of a view-in-browser link (`/v/TOKEN`): one campaign's
    /// message to one recipient, nobody else's.
    pub fn view_token(&self, campaign: i64, recipient: i64) -> String {
        BASE64URL_NOPAD.encode(&self.pair_token(
            Purpose::View,
            campaign,
            recipient,
            UNSUBSCRIBE_MAC_BYTES,
        ))
    }

    /// The (campaign, recipient) of a genuine view token.
    pub fn read_view(&self, token: &str) -> Option<(i64, i64)> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        self.read_pair(Purpose::View, &raw, UNSUBSCRIBE_MAC_BYTES)
    }

    /// The (campaign, recipient) of a genuine unsubscribe token.
    pub fn read_unsubscribe(&self, token: &str) -> Option<(i64, i64)> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        self.read_pair(Purpose::Unsubscribe, &raw, UNSUBSCRIBE_MAC_BYTES)
    }

    /// The token of a VERP return path (`bounces+TOKEN@domain`): lower-case
    /// letters and digits, about 23 characters.
    pub fn verp_token(&self, campaign: i64, recipient: i64) -> String {
        BASE32_LOWER.encode(&self.pair_token(Purpose::Verp, campaign, recipient, VERP_MAC_BYTES))
    }

    /// The (campaign, recipient) of a genuine VERP token, in any case.
    pub fn read_verp(&self, token: &str) -> Option<(i64, i64)> {
        let raw = BASE32_LOWER
            .decode(token.to_ascii_lowercase().as_bytes())
            .ok()?;
        self.read_pair(Purpose::Verp, &raw, VERP_MAC_BYTES)
    }

    /// The VERP token of transactional message `message`: made and read
    /// under a purpose of its own, so it never reads as a campaign's. The
    /// pair's second number is a format mark (1).
    pub fn message_verp_token(&self, message: i64) -> String {
        BASE32_LOWER.encode(&self.pair_token(Purpose::MessageVerp, message, 1, VERP_MAC_BYTES))
    }

    /// The message a genuine message VERP token names, in any case.
    pub fn read_message_verp(&self, token: &str) -> Option<i64> {
        let raw = BASE32_LOWER
            .decode(token.to_ascii_lowercase().as_bytes())
            .ok()?;
        match self.read_pair(Purpose::MessageVerp, &raw, VERP_MAC_BYTES)? {
            (message, 1) => Some(message),
            _ => None,
        }
    }

    /// The token in the local part of a message's Message-ID: lower-case
    /// base32 of campaign, recipient and a 96-bit MAC, about 26 characters.
    pub fn message_id_token(&self, campaign: i64, recipient: i64) -> String {
        BASE32_LOWER.encode(&self.pair_token(
            Purpose::MessageId,
            campaign,
            recipient,
            MESSAGE_ID_MAC_BYTES,
        ))
    }

    /// The (campaign, recipient) of a genuine Message-ID token, in any case.
    pub fn read_message_id_token(&self, token: &str) -> Option<(i64, i64)> {
        let raw = BASE32_LOWER
            .decode(token.to_ascii_lowercase().as_bytes())
            .ok()?;
        self.read_pair(Purpose::MessageId, &raw, MESSAGE_ID_MAC_BYTES)
    }

    /// The token of an open pixel (`/o/TOKEN`) of one content version's
    /// message to one recipient (0: a `campaign test` message).
    pub fn open_token(&self, message: Tracked) -> String {
        BASE64URL_NOPAD.encode(&self.tracked_token(Purpose::Open, message, None))
    }

    /// The message of a genuine open token.
    pub fn read_open(&self, token: &str) -> Option<Tracked> {
        self.read_tracked(Purpose::Open, token, None)
    }

    /// The token of link `n` (`/c/TOKEN/N`): the MAC covers `n` too, so a
    /// token is good for its own link number only.
    pub fn click_token(&self, message: Tracked, n: u32) -> String {
        BASE64URL_NOPAD.encode(&self.tracked_token(Purpose::Click, message, Some(n)))
    }

    /// The message of a genuine click token for link `n`.
    pub fn read_click(&self, token: &str, n: u32) -> Option<Tracked> {
        self.read_tracked(Purpose::Click, token, Some(n))
    }

    /// The open-pixel token (`/o/TOKEN`) of message `message` (a
    /// message template's, e.g. a flow step): a purpose of its own, so it
    /// never reads as a campaign's. The pair's second number is a format
    /// mark (1), as in [`Signer::message_verp_token`].
    pub fn message_open_token(&self, message: i64) -> String {
        self.message_token(Purpose::MessageOpen, message, 1)
    }

    /// The message of a genuine message open token.
    pub fn read_message_open(&self, token: &str) -> Option<i64> {
        match self.read_message_token(Purpose::MessageOpen, token)? {
            (message, 1) => Some(message),
            _ => None,
        }
    }

    /// The token of the preference centre (`/p/TOKEN`) of recipient
    /// `recipient`, made for message `message` to them.
    pub fn message_preferences_token(&self, message: i64, recipient: i64) -> String {
        self.message_token(Purpose::MessagePreferences, message, recipient)
    }

    /// The (message, recipient) of a genuine message preferences token.
    pub fn read_message_preferences(&self, token: &str) -> Option<(i64, i64)> {
        self.read_message_token(Purpose::MessagePreferences, token)
    }

    /// The view-in-browser token (`/v/TOKEN`) of message `message`.
    pub fn message_view_token(&self, message: i64) -> String {
        self.message_token(Purpose::MessageView, message, 1)
    }

    /// The message of a genuine message view token.
    pub fn read_message_view(&self, token: &str) -> Option<i64> {
        match self.read_message_token(Purpose::MessageView, token)? {
            (message, 1) => Some(message),
            _ => None,
        }
    }

    fn message_token(&self, purpose: Purpose, message: i64, second: i64) -> String {
        BASE64URL_NOPAD.encode(&self.pair_token(purpose, message, second, TRACKING_MAC_BYTES))
    }

    fn read_message_token(&self, purpose: Purpose, token: &str) -> Option<(i64, i64)> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        self.read_pair(purpose, &raw, TRACKING_MAC_BYTES)
    }

    /// varint(campaign) ‖ varint(recipient) ‖ varint(version) ‖ MAC over
    /// those and the link number.
    fn tracked_token(&self, purpose: Purpose, m: Tracked, n: Option<u32>) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        put_varint(&mut out, m.campaign as u64);
        put_varint(&mut out, m.recipient as u64);
        put_varint(&mut out, m.version as u64);
        let tag = self.mac_tracked(purpose, &out, n).finalize().into_bytes();
        out.extend_from_slice(&tag[..TRACKING_MAC_BYTES]);
        out
    }

    fn mac_tracked(&self, purpose: Purpose, ids: &[u8], n: Option<u32>) -> HmacSha256 {
        let mut mac = self.mac(purpose, ids);
        if let Some(n) = n {
            mac.update(b"\0");
            mac.update(&n.to_be_bytes());
        }
        mac
    }

    fn read_tracked(&self, purpose: Purpose, token: &str, n: Option<u32>) -> Option<Tracked> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        let (ids, tag) = raw.split_at(raw.len().checked_sub(TRACKING_MAC_BYTES)?);
        let mut rest = ids;
        let campaign = take_varint(&mut rest)?;
        let recipient = take_varint(&mut rest)?;
        let version = take_varint(&mut rest)?;
        if !rest.is_empty()
            || self
                .mac_tracked(purpose, ids, n)
                .verify_truncated_left(tag)
                .is_err()
        {
            return None;
        }
        Some(Tracked {
            campaign: i64::try_from(campaign).ok().filter(|&c| c > 0)?,
            recipient: i64::try_from(recipient).ok()?,
            version: i64::try_from(version).ok().filter(|&v| v > 0)?,
        })
    }

    /// varint(campaign) ‖ varint(recipient) ‖ MAC.
    fn pair_token(
        &self,
        purpose: Purpose,
        campaign: i64,
        recipient: i64,
        mac_len: usize,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(20);
        put_varint(&mut out, campaign as u64);
        put_varint(&mut out, recipient as u64);
        let tag = self.tag(purpose, &out, mac_len);
        out.extend_from_slice(&tag);
        out
    }

    fn read_pair(&self, purpose: Purpose, raw: &[u8], mac_len: usize) -> Option<(i64, i64)> {
        let (ids, tag) = raw.split_at(raw.len().checked_sub(mac_len)?);
        let mut rest = ids;
        let campaign = take_varint(&mut rest)?;
        let recipient = take_varint(&mut rest)?;
        if !rest.is_empty() || !self.verify(purpose, ids, tag) {
            return None;
        }
        let campaign = i64::try_from(campaign).ok().filter(|&c| c > 0)?;
        let recipient = i64::try_from(recipient).ok().filter(|&r| r > 0)?;
        Some((campaign, recipient))
    }
}

/// The message an open or click token names: a campaign's content
/// version sent to one recipient ([`Tracked::recipient`] 0: a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tracked {
    pub campaign: i64,
    pub recipient: i64,
    pub version: i64,
}

/// A database's identity as the stages use it: the id jobs carry and the
/// signer of its secret.
#[derive(Debug, Clone)]
pub struct Identity {
    pub database_id: String,
    pub signer: Signer,
}

impl From<&Installation> for Identity {
    fn from(i: &Installation) -> Identity {
        Identity {
            database_id: i.database_id.clone(),
            signer: Signer::new(&i.secret),
        }
    }
}

fn job_bytes(database_id: &str, campaign: i64, recipients: &[i64]) -> Vec<u8> {
    let mut data = Vec::with_capacity(database_id.len() + 9 + 8 * recipients.len());
    data.extend_from_slice(database_id.as_bytes());
    data.push(0);
    data.extend_from_slice(&campaign.to_be_bytes());
    for r in recipients {
        data.extend_from_slice(&r.to_be_bytes());
    }
    data
}

/// LEB128.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn take_varint(input: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (k, &byte) in input.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f).checked_shl(7 * k as u32)?;
        if byte & 0x80 == 0 {
            // A shortest encoding only: one value, one spelling.
            if k > 0 && byte == 0 {
                return None;
            }
            *input = &input[k + 1..];
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests;
