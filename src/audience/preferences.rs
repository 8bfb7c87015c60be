//! The preference centre (`/p/TOKEN`): a recipient, named by a token from
//! a message they were sent, sees their name and the public lists (ticked
//! where they are a member), and keeps the lists they tick, changes their
//! name, or leaves everything. Private lists are neither shown nor
//! changed. Saving the same form twice changes nothing more; changes hold
//! from the next campaign on (a campaign takes its list's members when it
//! is enqueued).

use crate::store::lists::{self, PublicList};
use crate::store::recipients::{self, RecipientStatus};
use crate::store::{engagement, optouts, preferences as stored, Conn, StoreError};

use super::subscribe::MAX_NAME;

#[derive(Debug, thiserror::Error)]
pub enum PreferencesError {
    /// What to show next to the form's fields: (field, message).
    #[error("the form has mistakes")]
    Fields(Vec<(&'static str, String)>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the page shows.
#[derive(Debug, Clone)]
pub struct Page {
    pub name: String,
    /// Every public list, and whether the recipient is a member.
    pub lists: Vec<(PublicList, bool)>,
    /// Unsubscribed (or bounced): no campaign reaches them whatever is
    /// ticked.
    pub status: RecipientStatus,
}

/// What a saved form asks.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub name: String,
    /// Names of the lists kept.
    pub keep: Vec<String>,
    pub unsubscribe_all: bool,
}

/// Recipient `id`'s page; `None` when there is no such recipient.
pub fn page(conn: &mut Conn, id: i64) -> Result<Option<Page>, PreferencesError> {
    let Some(r) = recipients::load(conn, &[id])?.pop() else {
        return Ok(None);
    };
    let member = stored::public_memberships(conn, id)?;
    let lists = lists::public(conn)?
        .into_iter()
        .map(|l| {
            let on = member.contains(&l.id);
            (l, on)
        })
        .collect();
    Ok(Some(Page {
        name: r.name,
        lists,
        status: r.status,
    }))
}

/// The mail a preference-centre token came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A campaign's message: leaving everything counts on that campaign.
    Campaign(i64),
    /// A message template's message (a flow step).
    Message(i64),
}

/// Save recipient `id`'s form (the token came in `via`); the page
/// afterwards, `None` when there is no such recipient.
pub fn save(
    conn: &mut Conn,
    (via, id): (Via, i64),
    change: &Change,
) -> Result<Option<Page>, PreferencesError> {
    let name = change.name.trim();
    if name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(PreferencesError::Fields(vec![(
            "name",
            format!("Use at most {MAX_NAME} characters."),
        )]));
    }
    if recipients::load(conn, &[id])?.is_empty() {
        return Ok(None);
    }
    conn.transaction(|conn| {
        stored::rename(conn, id, name)?;
        for l in lists::public(conn)? {
            if change.keep.iter().any(|k| k == &l.name) {
                stored::join(conn, l.id, id)?;
            } else {
                stored::leave(conn, l.id, id)?;
            }
        }
        match (change.unsubscribe_all, via) {
            (false, _) => {}
            (true, Via::Campaign(campaign)) => {
                let reason = format!("preference centre (campaign {campaign})");
                engagement::unsubscribe(conn, campaign, id, &reason)?;
            }
            (true, Via::Message(message)) => {
                let reason = format!("preference centre (message {message})");
                optouts::set_unsubscribed(conn, id, &reason)?;
            }
        }
        Ok::<_, StoreError>(())
    })?;
    page(conn, id)
}
