//! What one message of a tracked content version needs at render time:
//! the names of the variables the rewritten templates read, and the base
//! and counts its pixel and click URLs are made from (see
//! [`super::tracking`] for how a version's templates are rewritten).

use super::template_links::LinkMaker;
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
    /// Makes the click URLs of links the template writes, when it tracks
    /// clicks (see [`super::template_links`]).
    pub linker: Option<minijinja::Value>,
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
    pub clicks: bool,
    /// A message template's links, link 1 first: their click URLs carry
    /// the URL itself, bound to the message by the token (no stored
    /// table); empty for a campaign, whose table is stored.
    pub targets: Vec<String>,
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
        let linker = self.clicks.then(|| {
            let maker = LinkMaker::new(base, signer.message_links(message));
            minijinja::Value::from_object(maker)
        });
        MessageUrls {
            open,
            links,
            linker,
        }
    }

    /// The pixel and click URLs of message-template mail `message` (a
    /// flow step): `/o/TOKEN` and `/l/TOKEN?u=URL`, tokens of the
    /// message's own purposes.
    pub fn message_urls(&self, signer: &Signer, message: i64) -> MessageUrls {
        let base = &self.base;
        let open = self
            .opens
            .then(|| format!("{base}/o/{}", signer.message_open_token(message)));
        if !self.clicks {
            return MessageUrls {
                open,
                links: Vec::new(),
                linker: None,
            };
        }
        let maker = LinkMaker::new(base, signer.message_mail_links(message));
        let links = self
            .targets
            .iter()
            .map(|url| maker.click_url(url).unwrap_or_else(|| url.clone()))
            .collect();
        MessageUrls {
            open,
            links,
            linker: Some(minijinja::Value::from_object(maker)),
        }
    }
}
