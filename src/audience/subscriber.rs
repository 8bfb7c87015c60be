//! `mailsplit subscriber show | export`: what is held about one person
//! ([`crate::store::person`]), found by any spelling of the address.

use serde_json::Value;

use crate::store::{person, Conn, StoreError};

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
