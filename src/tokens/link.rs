//! Tokens of links a template writes at render time (`href="{{ p.url
//! }}"`): `/l/TOKEN?u=URL`. The URL is not in any table, so the token
//! binds it: its MAC covers the message (campaign, recipient, version)
//! and the exact URL, and a redirect goes only where this message's own
//! render pointed. A message's key is derived once (one HMAC under the
//! database's secret); each link then costs one HMAC under that key.

use hmac::Mac;

use super::{put_varint, take_varint, HmacSha256, Purpose, Signer, Tracked, TRACKING_MAC_BYTES};
use data_encoding::BASE64URL_NOPAD;

/// One message's key for its template links.
#[derive(Clone)]
pub struct MessageLinks {
    ids: Vec<u8>,
    key: HmacSha256,
}

impl std::fmt::Debug for MessageLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageLinks(<redacted>)")
    }
}

impl MessageLinks {
    /// The token of `url` in this message: varint ids ‖ MAC(key, url).
    pub fn token(&self, url: &str) -> String {
        let mut out = Vec::with_capacity(self.ids.len() + TRACKING_MAC_BYTES);
        out.extend_from_slice(&self.ids);
        out.extend_from_slice(&url_mac(&self.key, url)[..TRACKING_MAC_BYTES]);
        BASE64URL_NOPAD.encode(&out)
    }
}

fn url_mac(key: &HmacSha256, url: &str) -> Vec<u8> {
    let mut mac = key.clone();
    mac.update(url.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

impl Signer {
    /// The key of `message`'s template links (one HMAC).
    pub fn message_links(&self, message: Tracked) -> MessageLinks {
        let mut ids = Vec::with_capacity(16);
        put_varint(&mut ids, message.campaign as u64);
        put_varint(&mut ids, message.recipient as u64);
        put_varint(&mut ids, message.version as u64);
        MessageLinks {
            key: self.link_key(&ids),
            ids,
        }
    }

    /// The key of the links of message `message` (a message template's,
    /// e.g. a flow step): every link of such a message is tracked this
    /// way, bound to its URL, under a purpose of its own.
    pub fn message_mail_links(&self, message: i64) -> MessageLinks {
        let mut ids = Vec::with_capacity(8);
        put_varint(&mut ids, message as u64);
        MessageLinks {
            key: self.key_for(Purpose::MessageLink, &ids),
            ids,
        }
    }

    /// The message of a genuine message-link token for exactly `url`.
    pub fn read_message_link(&self, token: &str, url: &str) -> Option<i64> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        let (ids, tag) = raw.split_at(raw.len().checked_sub(TRACKING_MAC_BYTES)?);
        let mut rest = ids;
        let message = take_varint(&mut rest)?;
        let mut mac = self.key_for(Purpose::MessageLink, ids);
        mac.update(url.as_bytes());
        if !rest.is_empty() || mac.verify_truncated_left(tag).is_err() {
            return None;
        }
        i64::try_from(message).ok().filter(|&m| m > 0)
    }

    fn link_key(&self, ids: &[u8]) -> HmacSha256 {
        self.key_for(Purpose::TemplateLink, ids)
    }

    fn key_for(&self, purpose: Purpose, ids: &[u8]) -> HmacSha256 {
        let derived = self.mac(purpose, ids).finalize().into_bytes();
        // HMAC takes a key of any length; 32 bytes always do.
        HmacSha256::new_from_slice(&derived).unwrap_or_else(|_| self.key.clone())
    }

    /// The message of a genuine template-link token for exactly `url`.
    pub fn read_link(&self, token: &str, url: &str) -> Option<Tracked> {
        let raw = BASE64URL_NOPAD.decode(token.as_bytes()).ok()?;
        let (ids, tag) = raw.split_at(raw.len().checked_sub(TRACKING_MAC_BYTES)?);
        let mut rest = ids;
        let campaign = take_varint(&mut rest)?;
        let recipient = take_varint(&mut rest)?;
        let version = take_varint(&mut rest)?;
        let mut mac = self.link_key(ids);
        mac.update(url.as_bytes());
        if !rest.is_empty() || mac.verify_truncated_left(tag).is_err() {
            return None;
        }
        Some(Tracked {
            campaign: i64::try_from(campaign).ok().filter(|&c| c > 0)?,
            recipient: i64::try_from(recipient).ok()?,
            version: i64::try_from(version).ok().filter(|&v| v > 0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_token_is_good_for_its_own_message_and_url_only() {
        let s = Signer::new(&[7u8; 32]);
        let m = Tracked {
            campaign: 3,
            recipient: 42,
            version: 2,
        };
        let t = s.message_links(m).token("https://shop.test/p/1");
        assert_eq!(s.read_link(&t, "https://shop.test/p/1"), Some(m));
        assert_eq!(s.read_link(&t, "https://shop.test/p/2"), None);
        assert_eq!(s.read_link(&t, "https://evil.test/"), None);
        assert_eq!(
            s.read_link(&t[..t.len() - 1], "https://shop.test/p/1"),
            None
        );
        assert_eq!(
            Signer::new(&[8u8; 32]).read_link(&t, "https://shop.test/p/1"),
            None
        );
        let other = Tracked { recipient: 43, ..m };
        let t2 = s.message_links(other).token("https://shop.test/p/1");
        assert_ne!(t, t2);
        // Another purpose's token for the same message is none of ours.
        assert_eq!(
            s.read_link(&s.click_token(m, 1), "https://shop.test/p/1"),
            None
        );
        assert_eq!(s.read_click(&t, 1), None);
        assert!(t.len() <= 32, "{t}");
    }
}
