//! `mailsplit subscriber show | export`: what is held about one person
//! ([`crate::store::person`]), found by any spelling of the address;
//! `subscriber forget`: erase it ([`crate::store::erase`]).

use serde_json::Value;

pub use crate::store::erase::{Afterwards, Erased};
use crate::store::{erase, person, Conn, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum SubscriberError {
    #[error("{0:?} is not an email address")]
    BadEmail(String),
    #[error("nothing is held about {0:?} (no recipient, message or suppression entry); check the spelling")]
    Unknown(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SubscriberError {
    pub fn is_usage(&self) -> bool {
        match self {
            SubscriberError::BadEmail(_) | SubscriberError::Unknown(_) => true,
            SubscriberError::Store(e) => e.is_usage(),
        }
    }
}

/// Every row held about `email`, as one JSON object.
pub fn export(conn: &mut Conn, email: &str) -> Result<Value, SubscriberError> {
    let key = crate::mailbox::key(email.trim())
        .map_err(|_| SubscriberError::BadEmail(email.to_string()))?;
    person::export(conn, &key)?.ok_or_else(|| SubscriberError::Unknown(email.to_string()))
}

/// What `forget` did, and where the erased text may still be.
#[derive(Debug, Clone)]
pub struct Forgotten {
    /// The mailbox's key (what the person gave, folded).
    pub key: String,
    pub erased: erase::Erased,
    pub afterwards: erase::Afterwards,
}

/// Erase everything held about `email` (GDPR art. 17): see
/// [`crate::store::erase`]. Works for an address nothing is known about
/// too: its keyed hash is kept all the same, so it is never added later.
/// The CLI's `subscriber forget` and `DELETE /api/v1/subscribers/{email}`.
pub fn forget(conn: &mut Conn, email: &str) -> Result<Forgotten, SubscriberError> {
    let key = crate::mailbox::key(email.trim())
        .map_err(|_| SubscriberError::BadEmail(email.to_string()))?;
    let erased = erase::forget(conn, &key)?;
    let afterwards = erase::flush(conn)?;
    Ok(Forgotten {
        key,
        erased,
        afterwards,
    })
}
