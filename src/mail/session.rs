//! One SMTP session with the relay: connect, EHLO, STARTTLS or implicit
//! TLS, AUTH, then one message after another on the same connection
//! (each message's exchange is in `transaction`).
//!
//! Each sender task owns one [`Session`]: lettre's `AsyncSmtpConnection`
//! built over a tokio `TcpStream` with TCP_NODELAY set: lettre 0.11.23
//! writes the body and the final "." separately, and with Nagle on every
//! message would wait for the peer's delayed ACK (~40 ms). STARTTLS upgrades
//! that same stream; implicit TLS (`smtps://`) uses lettre's own connector.
//! lettre does the handshake (greeting, EHLO, STARTTLS, AUTH); it keeps
//! only the EHLO keywords it knows, so the session asks EHLO once more
//! itself (before AUTH) to learn whether the relay offers PIPELINING.

use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::commands::Ehlo;
use lettre::transport::smtp::extension::{ClientId, Extension};
use tokio::net::TcpStream;

use super::replies::Inbox;
use super::reply::{Reply, Verdict};
use super::stream::{Outbox, WriteBehind};
use super::{Composed, MailError};
use crate::config::{SmtpUrl, Tls};

/// One open session with the relay, owned by one sender task.
pub struct Session {
    pub(super) conn: AsyncSmtpConnection,
    /// The relay offers PIPELINING (RFC 2920): a message's MAIL, RCPT and
    /// DATA go out in one write.
    pub(super) pipelining: bool,
    /// A reply said the session cannot go on (lost connection, timeout,
    /// 421, a confused command sequence): open a new one.
    pub(super) broken: bool,
    /// The last transaction ended early (a refused recipient): RSET goes
    /// before the next MAIL (in the same flight when pipelining).
    pub(super) dirty: bool,
    /// The plain TCP stream's write buffer, where a message's body is
    /// dot-stuffed directly, and through which a transaction's replies are
    /// read into `inbox`; `None` under TLS (the bytes must go through it,
    /// and lettre reads every reply).
    pub(super) outbox: Option<Outbox>,
    pub(super) inbox: Inbox,
}

impl Session {
    /// Whether this session must be dropped and a new one opened.
    pub fn has_broken(&self) -> bool {
        self.broken || self.conn.has_broken()
    }

    /// Whether the relay offered PIPELINING on this session.
    pub fn pipelining(&self) -> bool {
        self.pipelining
    }

    /// Say goodbye (QUIT); whatever the relay answers, the session is over.
    /// A broken session gets no QUIT: its state is unknown (a reply may
    /// still be on its way), and dropping it closes the connection.
    pub async fn quit(&mut self) {
        if !self.has_broken() {
            // why: lettre closes the connection itself when QUIT fails; its
            // `abort` after a QUIT that went through would send a second one
            let _ = self.conn.quit().await;
        }
    }
}

/// Connection settings for one relay, shared by every sender task.
#[derive(Clone)]
pub struct Relay {
    url: SmtpUrl,
    hello: ClientId,
    shown: String,
    /// Built once: certificate roots are parsed at start-up, not per session.
    tls: Option<TlsParameters>,
    /// Bound on connecting and on each SMTP exchange.
    timeout: Duration,
}

impl Relay {
    pub fn new(url: SmtpUrl, timeout: Duration) -> Result<Relay, MailError> {
        let shown = format!("{}:{}", url.host, url.port);
        let tls = match (url.tls, &url.ca) {
            (Tls::None, _) => None,
            (_, None) => {
                Some(
                    TlsParameters::new(url.host.clone()).map_err(|e| MailError::TlsSetup {
                        path: String::new(),
                        source: Box::new(e),
                    })?,
                )
            }
            (_, Some(path)) => {
                let err = |source: Box<dyn std::error::Error + Send + Sync>| MailError::TlsSetup {
                    path: path.clone(),
                    source,
                };
                let pem = std::fs::read(path).map_err(|e| err(Box::new(e)))?;
                let cert = Certificate::from_pem(&pem).map_err(|e| err(Box::new(e)))?;
                Some(
                    TlsParameters::builder(url.host.clone())
                        .add_root_certificate(cert)
                        .build()
                        .map_err(|e| err(Box::new(e)))?,
                )
            }
        };
        Ok(Relay {
            url,
            hello: ClientId::default(),
            shown,
            tls,
            timeout,
        })
    }

    pub fn target(&self) -> &str {
        &self.shown
    }

    fn connect_err<E>(&self) -> impl FnOnce(E) -> MailError + '_
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        move |e| MailError::Connect {
            target: self.shown.clone(),
            source: Box::new(e),
        }
    }

    /// Open one session: connect, EHLO, STARTTLS and AUTH as the URL asks.
    pub async fn connect(&self) -> Result<Session, MailError> {
        // A relay at its process limit accepts the connection but never
        // greets it: a shorter bound than a message's exchange.
        let greeting = self.timeout.min(crate::config::CONNECT_TIMEOUT);
        let (mut conn, mut outbox) = self.open(greeting).await?;
        if let Tls::StartTls { required } = self.url.tls {
            if conn.can_starttls() {
                outbox = None;
                timed(self.timeout, conn.starttls(self.tls_params()?, &self.hello))
                    .await
                    .map_err(self.connect_err())?;
            } else if required {
                conn.abort().await;
                return Err(MailError::NoStartTls(self.shown.clone()));
            }
        }
        // lettre's ServerInfo drops the keywords it does not use, PIPELINING
        // among them: ask once more (EHLO resets nothing here, and comes
        // before AUTH) and read the keywords ourselves.
        let ehlo = timed(self.timeout, conn.command(Ehlo::new(self.hello.clone())))
            .await
            .map_err(self.connect_err())?;
        let pipelining = ehlo.message().any(|line| {
            line.split_whitespace()
                .next()
                .is_some_and(|w| w.eq_ignore_ascii_case("PIPELINING"))
        });
        if let Some((user, pass)) = &self.url.credentials {
            // Whatever the relay offers (or a man in the middle stripped):
            // no password over a session that is not encrypted, unless the
            // URL says so for a loopback relay.
            if !conn.is_encrypted() && !self.url.auth_in_clear {
                conn.abort().await;
                return Err(MailError::AuthInClear(self.shown.clone()));
            }
            let creds = Credentials::new(user.clone(), pass.clone());
            timed(
                self.timeout,
                conn.auth(&[Mechanism::Plain, Mechanism::Login], &creds),
            )
            .await
            .map_err(|e| MailError::Auth {
                target: self.shown.clone(),
                user: user.clone(),
                // A relay's reply could echo what it was sent.
                reason: crate::redact::hide(&e.to_string(), pass),
            })?;
        }
        Ok(Session {
            outbox: outbox.filter(|_| !conn.is_encrypted()),
            conn,
            pipelining,
            broken: false,
            dirty: false,
            inbox: Inbox::default(),
        })
    }

    /// The TLS settings, which only a relay URL asking for TLS has.
    fn tls_params(&self) -> Result<TlsParameters, MailError> {
        self.tls
            .clone()
            .ok_or_else(|| MailError::NoStartTls(self.shown.clone()))
    }

    /// The connection up to the greeting: TLS from the first byte
    /// (`smtps://`), or plain TCP with TCP_NODELAY behind a write buffer
    /// (and that buffer).
    async fn open(
        &self,
        greeting: Duration,
    ) -> Result<(AsyncSmtpConnection, Option<Outbox>), MailError> {
        let conn = match self.url.tls {
            Tls::Implicit => AsyncSmtpConnection::connect_tokio1(
                (self.url.host.as_str(), self.url.port),
                Some(greeting),
                &self.hello,
                Some(self.tls_params()?),
                None,
            )
            .await
            .map_err(self.connect_err())
            .map(|conn| (conn, None))?,
            Tls::None | Tls::StartTls { .. } => {
                let stream = tokio::time::timeout(
                    greeting,
                    TcpStream::connect((self.url.host.as_str(), self.url.port)),
                )
                .await
                .map_err(self.connect_err())?
                .map_err(self.connect_err())?;
                stream.set_nodelay(true).map_err(self.connect_err())?;
                let (stream, outbox) = WriteBehind::new(stream);
                let conn = timed(
                    greeting,
                    AsyncSmtpConnection::connect_with_transport(Box::new(stream), &self.hello),
                )
                .await
                .map_err(self.connect_err())?;
                (conn, Some(outbox))
            }
        };
        Ok(conn)
    }
}

impl Relay {
    /// Send one message on an open session. A timeout counts as transient.
    pub async fn send(&self, session: &mut Session, msg: &Composed) -> Verdict {
        if let Some(refused) = self.needs_missing_smtputf8(&session.conn, msg) {
            return refused;
        }
        match tokio::time::timeout(self.timeout, session.transact(msg)).await {
            Ok(verdict) => verdict,
            Err(_) => {
                // The session is in an unknown state: the caller drops it,
                // which closes the connection without QUIT. (lettre's
                // `abort` sends QUIT first: a relay that then answers the
                // message and the QUIT sees a session that ended well,
                // where the sender never heard its 250.)
                session.broken = true;
                Verdict::Transient(Reply::local(format!("no reply within {:?}", self.timeout)))
            }
        }
    }
}

impl Relay {
    /// Compose writes every domain as an A-label, so only a non-ASCII local
    /// part needs the relay's SMTPUTF8. Without it the message can never go
    /// through this relay: a permanent failure of this recipient (or of
    /// every recipient, for a sender address), saying why.
    fn needs_missing_smtputf8(
        &self,
        conn: &AsyncSmtpConnection,
        msg: &Composed,
    ) -> Option<Verdict> {
        if conn.server_info().supports_feature(Extension::SmtpUtfEight) {
            return None;
        }
        let from = msg.envelope.from().into_iter();
        let address = from
            .chain(msg.envelope.to())
            .find(|a| crate::mailbox::needs_smtputf8(a))?;
        Some(Verdict::Permanent(Reply::local(format!(
            "address {address} has a non-ASCII local part, which needs SMTPUTF8, and relay {} does not offer SMTPUTF8",
            self.shown
        ))))
    }
}

/// An SMTP step bounded by `limit`.
async fn timed<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, TimedError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(TimedError::Smtp),
        Err(_) => Err(TimedError::Timeout(limit)),
    }
}

#[derive(Debug, thiserror::Error)]
enum TimedError {
    #[error(transparent)]
    Smtp(lettre::transport::smtp::Error),
    #[error("no reply within {0:?}")]
    Timeout(Duration),
}
