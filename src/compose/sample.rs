//! One list member to show a campaign's content with (`campaign test`, the
//! dashboard's campaign page), and that content rendered for them without
//! a message around it: the links name [`super::TEST_RECIPIENT`], so
//! following one from a preview changes nobody.

use super::{render, unsubscribe, ComposeError, TEST_RECIPIENT};
use crate::store::{recipients, Conn, Recipient, RecipientStatus};
use crate::templates::Rendered;

pub use super::CampaignMail;

/// Pages of list members looked through for an active one.
const PAGE: i64 = 1_000;

/// The recipient `email` (any list, any status), or else the first active
/// member of list `list_id`.
pub fn sample(
    conn: &mut Conn,
    list_id: i64,
    email: Option<&str>,
) -> Result<Recipient, ComposeError> {
    if let Some(e) = email {
        let id = recipients::find_by_email(conn, e)?
            .ok_or_else(|| ComposeError::UnknownRecipient(e.to_string()))?;
        return recipients::load(conn, &[id])?
            .pop()
            .ok_or_else(|| ComposeError::UnknownRecipient(e.to_string()));
    }
    let mut after = 0;
    loop {
        let page = recipients::member_page(conn, list_id, after, PAGE)?;
        let Some(&(last, _)) = page.last() else {
            return Err(ComposeError::EmptyList(format!("list {list_id}")));
        };
        if let Some(&(id, _)) = page.iter().find(|(_, s)| *s == RecipientStatus::Active) {
            return recipients::load(conn, &[id])?
                .pop()
                .ok_or_else(|| ComposeError::UnknownRecipient(format!("id {id}")));
        }
        after = last;
    }
}

/// The subject and both parts `r` would read, rendered exactly as the
/// worker renders them but with test links; `Err` says why it cannot be.
pub fn render_sample(campaign: &CampaignMail, r: &Recipient) -> Result<(String, Rendered), String> {
    let attributes: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&r.attributes).unwrap_or_default();
    let (unsubscribe_url, _) = unsubscribe(campaign, TEST_RECIPIENT, &Default::default());
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        render(campaign, (TEST_RECIPIENT, r), &attributes, &unsubscribe_url)
    }))
    .unwrap_or_else(|_| {
        Err(super::Unsendable::Invalid(
            "internal error while rendering".into(),
        ))
    })
    .map_err(|why| match why {
        super::Unsendable::Invalid(e) => e,
        super::Unsendable::Inactive(s) => format!("the recipient is {s}"),
    })
}
