//! What one message of a tracked content version needs at render time:
//! the names of the variables the rewritten templates read, and the base
//! and counts its pixel and click URLs are made from (see
//! [`super::tracking`] for how a version's templates are rewritten).

use crate::tokens::{Signer, Tracked};

/// The variable holding one message's open-pixel URL.
pub const OPEN_VAR: &str = "__mailsplit_open";
/// The variable holding one message's click URLs, link 1 first.
pub const LINKS_VAR: &str = "__mailsplit_links";

/// One message's tracking URLs.
#[derive(Debug, Clone)]
pub struct MessageUrls {
    pub open: Option<String>,
    pub links: Vec<String>,
}

/// What a campaign's messages need to make their tracking URLs.
#[derive(Debug, Clone)]
pub struct TrackingUrls {
    /// The public URL, without a trailing `/`.
    pub base: String,
    pub version: i64,
    pub opens: bool,
    /// How many links the version's table has.
    pub links: usize,
}

impl TrackingUrls {
    /// The pixel and click URLs of the message to `recipient`.
    pub fn urls(&self, signer: &Signer, campaign: i64, recipient: i64) -> MessageUrls {
        let message = Tracked {
            campaign,
            recipient,
            version: self.version,
        };
        let base = &self.base;
        let open = self
            .opens
            .then(|| format!("{base}/o/{}", signer.open_token(message)));
        let links = (1..=self.links as u32)
            .map(|n| format!("{base}/c/{}/{n}", signer.click_token(message, n)))
            .collect();
        MessageUrls { open, links }
    }
}
