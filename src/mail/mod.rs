//! SMTP delivery: sessions with the relay, and what its replies mean.
//! Read in this order: [`session`] (connect with TCP_NODELAY, STARTTLS or
//! implicit TLS, AUTH), `transaction` (one message: MAIL, RCPT, DATA and
//! the body, pipelined when the relay offers it), `stream` (the
//! write-behind TCP stream under a session), `replies` (a transaction's
//! replies, read on plain TCP), [`reply`] (reply and enhanced status codes
//! into a verdict). Messages are built by `compose`; this module only
//! carries them.

mod replies;
pub mod reply;
pub mod session;
mod stream;
mod transaction;

use lettre::address::Envelope;

pub use reply::{Enhanced, Reply, Verdict};
pub use session::{Relay, Session};

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("cannot connect to SMTP relay {target}")]
    Connect {
        target: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("SMTP relay {0} does not offer STARTTLS, and the URL says tls=required")]
    NoStartTls(String),
    #[error("SMTP relay {0}: the session is not encrypted (no STARTTLS offered), so the password is not sent; fix the relay's TLS, or for a relay on this machine add auth=plain-insecure to the URL")]
    AuthInClear(String),
    #[error("SMTP relay {target} refused the login of user {user:?}: {reason}; check the user and password in the SMTP URL (write a literal % as %25, @ as %40, / as %2F)")]
    Auth {
        target: String,
        user: String,
        reason: String,
    },
    #[error("cannot set up TLS with CA file {path:?}")]
    TlsSetup {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// One message ready for the wire: who it is from and for (SMTP envelope)
/// and its bytes (headers and body).
#[derive(Debug, Clone)]
pub struct Composed {
    pub envelope: Envelope,
    pub bytes: Vec<u8>,
}
