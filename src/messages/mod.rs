//! Transactional messages: message templates ([`templates`]),
//! and one message at a time submitted by the shop's application
//! ([`submit`]) — stored once per idempotency key, queued on beanstalkd
//! above every campaign, and sent by the same workers
//! (`worker::message`); messages whose jobs were lost get them again
//! ([`sweep`]). The CLI (`template …`, `send`) and the HTTP API call
//! these functions; validation and wording live here.

pub mod submit;
pub mod sweep;
pub mod templates;

pub use submit::{get, submit, submit_as, AskedBy, MessageView, Queue, Submit, Submitted};

use crate::campaign::content::ContentError;
use crate::compose::ComposeError;
use crate::queue::QueueError;
use crate::store::StoreError;

/// Why a template command or a submit was refused.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("unknown message template {0:?}; `mailsplit template ls` shows them")]
    UnknownTemplate(String),
    #[error("message template {0:?} already exists; `mailsplit template edit` changes it")]
    TemplateExists(String),
    #[error("bad recipient {0:?}: use user@example.com or \"Name <user@example.com>\"")]
    BadTo(String),
    #[error("bad data: {0}")]
    BadData(String),
    #[error("bad idempotency key: {0}")]
    BadKey(String),
    #[error("idempotency key {0:?} was already used for another message (another template, recipient or data)")]
    KeyReused(String),
    /// Refused before anything was stored: the suppression list or an
    /// erasure (`subscriber forget`) covers the address.
    #[error("{0}")]
    Refused(&'static str),
    #[error("no message {0}")]
    UnknownMessage(i64),
    /// `--track` or `--public-url` refused, the message naming the fix.
    #[error("{0}")]
    Tracking(String),
    #[error(transparent)]
    Content(#[from] ContentError),
    #[error(transparent)]
    Compose(#[from] ComposeError),
    #[error("cannot queue the message (it is stored; a retry with the same idempotency key queues it again)")]
    Queue(#[source] QueueError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MessageError {
    /// Errors in what the caller sent (exit code 2; 4xx over HTTP).
    pub fn is_usage(&self) -> bool {
        match self {
            MessageError::Compose(e) => e.is_usage(),
            MessageError::Store(e) => e.is_usage(),
            MessageError::Queue(_) => false,
            _ => true,
        }
    }
}
