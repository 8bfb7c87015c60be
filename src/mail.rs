//! SMTP: composing one message per recipient and sending it over a
//! long-lived connection.
//!
//! Each sender task owns one `AsyncSmtpConnection` built over a tokio
//! `TcpStream` with TCP_NODELAY set: lettre 0.11.23 writes the body and the
//! final "." separately, and with Nagle on every message would wait for the
//! peer's delayed ACK (~40 ms). STARTTLS upgrades that same stream; implicit
//! TLS (`smtps://`) uses lettre's own connector.

use std::io;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use lettre::address::Envelope;
use lettre::message::{header::ContentType, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::AsyncTokioStream;
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::{Address, Message};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::{SmtpUrl, Tls};

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("bad sender address {0:?}: use user@example.com or \"Name <user@example.com>\"")]
    BadFrom(String),
    #[error("invalid recipient address {0:?}")]
    BadRecipient(String),
    #[error("cannot build the message")]
    Build(#[source] lettre::error::Error),
    #[error("cannot connect to SMTP relay {target}")]
    Connect {
        target: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("SMTP relay {0} does not offer STARTTLS, and the URL says tls=required")]
    NoStartTls(String),
    #[error("cannot set up TLS with CA file {path:?}")]
    TlsSetup {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl MailError {
    pub fn is_usage(&self) -> bool {
        matches!(self, MailError::BadFrom(_))
    }
}

/// Parse `--from`: a bare address or `Name <address>`.
pub fn parse_from(raw: &str) -> Result<Mailbox, MailError> {
    if raw.chars().any(char::is_control) {
        return Err(MailError::BadFrom(raw.to_string()));
    }
    Mailbox::from_str(raw.trim()).map_err(|_| MailError::BadFrom(raw.to_string()))
}

/// One message ready for the wire.
#[derive(Debug, Clone)]
pub struct Composed {
    pub envelope: Envelope,
    pub bytes: Vec<u8>,
}

/// Build the MIME message (text + HTML alternative parts). Header values go
/// through lettre's encoder, so a name holding CR/LF or "Bcc:" stays inside
/// its encoded-word and can never add a header or a recipient; the envelope
/// names exactly one recipient.
pub fn compose(
    from: &Mailbox,
    subject: &str,
    message_id: String,
    to_name: &str,
    to_email: &str,
    html: String,
    text: String,
) -> Result<Composed, MailError> {
    let address =
        Address::from_str(to_email).map_err(|_| MailError::BadRecipient(to_email.to_string()))?;
    // Control characters never reach a header: lettre's encoder refuses
    // (panics on) a display name with CR/LF, and they have no business there.
    let name = one_line(to_name);
    // The envelope is given, not derived from the headers: lettre's own
    // derivation fails on a quoted local part ("john q. public"@…).
    let envelope =
        Envelope::new(Some(from.email.clone()), vec![address.clone()]).map_err(MailError::Build)?;
    let to = Mailbox::new((!name.is_empty()).then_some(name), address);
    let message = Message::builder()
        .envelope(envelope)
        .from(from.clone())
        .to(to)
        .subject(one_line(subject))
        .message_id(Some(message_id))
        .multipart(
            MultiPart::alternative()
                .singlepart(
                    SinglePart::builder()
                        .header(ContentType::TEXT_PLAIN)
                        .body(text),
                )
                .singlepart(
                    SinglePart::builder()
                        .header(ContentType::TEXT_HTML)
                        .body(html),
                ),
        )
        .map_err(MailError::Build)?;
    Ok(Composed {
        envelope: message.envelope().clone(),
        bytes: message.formatted(),
    })
}

/// `text` with every control character (CR, LF, TAB, …) turned into a
/// space, trimmed: safe for a header value.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// What a send attempt means for the recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: accepted.
    Sent,
    /// 5xx or a message the relay can never take: record as failed.
    Permanent(String),
    /// 4xx, timeout, lost connection: try again later.
    Transient(String),
}

/// Sort a lettre error by what should happen to the recipient.
pub fn classify(err: &lettre::transport::smtp::Error) -> Verdict {
    let text = err.to_string();
    if err.is_permanent() || err.is_client() {
        Verdict::Permanent(text)
    } else {
        Verdict::Transient(text)
    }
}

/// Whether a transient reply asks us to slow down (421, or 4xx wording).
pub fn is_slow_down(reply: &str) -> bool {
    let lower = reply.to_ascii_lowercase();
    lower.contains("421")
        || lower.contains("slow down")
        || lower.contains("rate limit")
        || lower.contains("too many")
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
    pub async fn connect(&self) -> Result<AsyncSmtpConnection, MailError> {
        let tls = || {
            self.tls
                .clone()
                .ok_or_else(|| MailError::NoStartTls(self.shown.clone()))
        };
        let mut conn = match self.url.tls {
            Tls::Implicit => AsyncSmtpConnection::connect_tokio1(
                (self.url.host.as_str(), self.url.port),
                Some(self.timeout),
                &self.hello,
                Some(tls()?),
                None,
            )
            .await
            .map_err(self.connect_err())?,
            Tls::None | Tls::StartTls { .. } => {
                let stream = tokio::time::timeout(
                    self.timeout,
                    TcpStream::connect((self.url.host.as_str(), self.url.port)),
                )
                .await
                .map_err(self.connect_err())?
                .map_err(self.connect_err())?;
                stream.set_nodelay(true).map_err(self.connect_err())?;
                timed(
                    self.timeout,
                    AsyncSmtpConnection::connect_with_transport(
                        Box::new(WriteBehind::new(stream)),
                        &self.hello,
                    ),
                )
                .await
                .map_err(self.connect_err())?
            }
        };
        if let Tls::StartTls { required } = self.url.tls {
            if conn.can_starttls() {
                timed(self.timeout, conn.starttls(tls()?, &self.hello))
                    .await
                    .map_err(self.connect_err())?;
            } else if required {
                conn.abort().await;
                return Err(MailError::NoStartTls(self.shown.clone()));
            }
        }
        if let Some((user, pass)) = &self.url.credentials {
            let creds = Credentials::new(user.clone(), pass.clone());
            timed(
                self.timeout,
                conn.auth(&[Mechanism::Plain, Mechanism::Login], &creds),
            )
            .await
            .map_err(self.connect_err())?;
        }
        Ok(conn)
    }
}

impl Relay {
    /// Send one message on an open session. A timeout counts as transient.
    pub async fn send(&self, conn: &mut AsyncSmtpConnection, msg: &Composed) -> Verdict {
        match tokio::time::timeout(self.timeout, conn.send(&msg.envelope, &msg.bytes)).await {
            Ok(Ok(_)) => Verdict::Sent,
            Ok(Err(e)) => classify(&e),
            Err(_) => {
                // The session is in an unknown state: drop it without QUIT.
                let _ = tokio::time::timeout(Duration::from_millis(100), conn.abort()).await;
                Verdict::Transient(format!("no reply within {:?}", self.timeout))
            }
        }
    }
}

/// A TCP stream that holds what is written until the peer's answer is
/// awaited. SMTP is request/response, so nothing is delayed: the bytes go
/// out, in one write, as soon as lettre reads. lettre writes a message's
/// body and its final "." separately (and flushes each); coalesced they are
/// one segment instead of two on the wire, one system call instead of two,
/// and one wake-up for the relay. Under STARTTLS the TLS layer sits above
/// this one, so whole records are coalesced the same way.
#[derive(Debug)]
struct WriteBehind {
    inner: TcpStream,
    pending: Vec<u8>,
    /// How much of `pending` is already written.
    sent: usize,
}

/// Held bytes beyond this are written at once, so the buffer stays small
/// whatever the message size.
const WRITE_BEHIND_MAX: usize = 64 * 1024;

impl WriteBehind {
    fn new(inner: TcpStream) -> WriteBehind {
        WriteBehind {
            inner,
            pending: Vec::with_capacity(4 * 1024),
            sent: 0,
        }
    }

    /// Write out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WriteBehind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.pending.len() + buf.len() > WRITE_BEHIND_MAX {
            ready!(self.poll_drain(cx))?;
            if buf.len() > WRITE_BEHIND_MAX {
                return Pin::new(&mut self.inner).poll_write(cx, buf);
            }
        }
        self.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    /// Deferred to the next read (see the type's documentation).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl AsyncRead for WriteBehind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncTokioStream for WriteBehind {
    fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.peer_addr()
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn write_behind_sends_what_it_holds_when_the_reply_is_awaited() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut relay, _) = listener.accept().await.unwrap();
        let mut session = WriteBehind::new(client);
        // What lettre does at the end of a message: two flushed writes.
        session.write_all(b"Hello").await.unwrap();
        session.flush().await.unwrap();
        session.write_all(b"\r\n.\r\n").await.unwrap();
        session.flush().await.unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(200), relay.read(&mut buf)).await;
        assert!(early.is_err(), "bytes left before the reply was awaited");

        let reply = tokio::spawn(async move {
            let mut r = [0u8; 16];
            let n = session.read(&mut r).await.unwrap();
            r[..n].to_vec()
        });
        let mut got = Vec::new();
        while got.len() < 10 {
            let n = relay.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed early");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"Hello\r\n.\r\n");
        relay.write_all(b"250 ok\r\n").await.unwrap();
        assert_eq!(reply.await.unwrap(), b"250 ok\r\n");
    }

    #[test]
    fn header_injection_stays_in_its_header() {
        let from = parse_from("Shop <news@example.test>").unwrap();
        let msg = compose(
            &from,
            "Hi",
            "<1.2@mailsplit>".into(),
            "x\r\nBcc: victim@evil.test",
            "ada@example.test",
            "<p>hi</p>".into(),
            "hi".into(),
        )
        .unwrap();
        let text = String::from_utf8(msg.bytes).unwrap();
        assert!(!text.contains("\r\nBcc:"), "{text}");
        assert_eq!(msg.envelope.to().len(), 1);
        assert!(compose(
            &from,
            "s",
            "<x@y>".into(),
            "",
            "not an address",
            String::new(),
            String::new()
        )
        .is_err());
        assert!(parse_from("bad\r\nBcc: x@y").is_err());
    }
}
