//! The recipient's own pages a message links to: the preference centre
//! (`preferences_url`, `/p/TOKEN`) and view in browser (`view_url`,
//! `/v/TOKEN`), and the message such a view shows: the content version
//! that recipient was sent, rendered for them exactly as a worker renders
//! it (tracking links intact), never anyone else's.

use super::content::Cache;
use super::{render, tracking, CampaignMail, ComposeError};
use crate::store::{ab, campaigns, installation, recipients, views, Campaign, Conn};
use crate::templates::Rendered;
use crate::tokens::Identity;

/// `(preferences_url, view_url)` of `campaign`'s message to `recipient`;
/// empty without a public URL.
pub fn own_urls(campaign: &CampaignMail, recipient: i64) -> (String, String) {
    let Some(base) = &campaign.public_url else {
        return (String::new(), String::new());
    };
    let base = base.trim_end_matches('/');
    let signer = &campaign.identity.signer;
    (
        format!(
            "{base}/p/{}",
            signer.preferences_token(campaign.id, recipient)
        ),
        format!("{base}/v/{}", signer.view_token(campaign.id, recipient)),
    )
}

/// The message a `/v/` token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// (campaign, recipient).
    Campaign(i64, i64),
    /// A message template's message (a flow step).
    Message(i64),
}

/// The subject and parts of the message `which` names, as its recipient
/// got it; `None` when there is none.
pub fn shown(conn: &mut Conn, which: Shown) -> Result<Option<(String, Rendered)>, ComposeError> {
    match which {
        Shown::Campaign(campaign, recipient) => sent_message(conn, campaign, recipient),
        Shown::Message(id) => super::message::sent_message(conn, id),
    }
}

/// The message campaign `campaign` sent recipient `recipient`: its
/// subject and parts; `None` when it sent them nothing.
pub fn sent_message(
    conn: &mut Conn,
    campaign: i64,
    recipient: i64,
) -> Result<Option<(String, Rendered)>, ComposeError> {
    let Some(version) = views::sent_version(conn, campaign, recipient)? else {
        return Ok(None);
    };
    let (Some(c), Some(r)) = (
        campaigns::get(conn, campaign)?,
        recipients::load(conn, &[recipient])?.pop(),
    ) else {
        return Ok(None);
    };
    let identity = Identity::from(&installation::load(conn)?);
    let mut mail = CampaignMail::load_cached(conn, &c, &identity, &Cache::default())?;
    if let Some(v) = version.filter(|&v| v != mail.content_version) {
        let Some(s) = views::version(conn, campaign, v)? else {
            return Ok(None);
        };
        let links = tracking::stored_links(conn, &c, &s)?;
        mail.content = Some(std::sync::Arc::new(tracking::compile_stored(
            &s, &c, links,
        )?));
        mail.content_version = v;
    }
    if let Some(own) = variant_sent(conn, &c, recipient, &mail)? {
        mail = own;
    }
    let attributes = serde_json::from_str(&r.attributes).unwrap_or_default();
    let (unsubscribe_url, _) = super::unsubscribe(&mail, recipient, &attributes);
    match render(&mail, (recipient, &r), &attributes, &unsubscribe_url) {
        Ok(m) => Ok(Some(m)),
        Err(e) => Err(ComposeError::Unsendable {
            email: r.email.clone(),
            why: format!("{e:?}"),
        }),
    }
}

/// The A/B variant (B, C, …) the ledger says `recipient` was sent, as
/// its messages are composed; `None` for variant A, or a variant that no
/// longer matches the content shown (A edited since).
fn variant_sent(
    conn: &mut Conn,
    c: &Campaign,
    recipient: i64,
    mail: &CampaignMail,
) -> Result<Option<CampaignMail>, ComposeError> {
    let Some(n) = ab::variant_of(conn, c.id, recipient)?.filter(|&n| n > 0) else {
        return Ok(None);
    };
    match ab::variants(conn, c.id)?.into_iter().find(|v| v.n == n) {
        Some(v) => mail.variant(conn, c, &v),
        None => Ok(None),
    }
}
