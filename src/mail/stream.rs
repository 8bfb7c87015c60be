//! The TCP stream under every plain or STARTTLS session.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use lettre::transport::smtp::client::AsyncTokioStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TCP stream that holds what is written until the peer's answer is
/// awaited. SMTP is request/response, so nothing is delayed: the bytes go
/// out, in one write, as soon as lettre reads. lettre writes a message's
/// body and its final "." separately (and flushes each); coalesced they are
/// one segment instead of two on the wire, one system call instead of two,
/// and one wake-up for the relay. Under STARTTLS the TLS layer sits above
/// this one, so whole records are coalesced the same way.
///
/// The stream and its held bytes are an [`Outbox`] the session shares: it
/// may write into it directly (a message's body, dot-stuffed straight into
/// it rather than copied three times on its way through lettre) and read
/// replies through it, only while nothing (TLS) sits above this stream.
#[derive(Debug)]
pub(crate) struct WriteBehind {
    wire: Outbox,
}

/// The stream and what a [`WriteBehind`] holds for it, shared with the
/// session over it (see `super::replies` for the reading side).
#[derive(Debug, Clone)]
pub(crate) struct Outbox(Arc<Mutex<Held>>);

#[derive(Debug)]
struct Held {
    stream: TcpStream,
    pending: Vec<u8>,
    /// How much of `pending` is already written.
    sent: usize,
}

impl Outbox {
    /// Add to what goes out before the next read, through `write`.
    pub(crate) fn append<T>(&self, write: impl FnOnce(&mut Vec<u8>) -> T) -> T {
        write(&mut self.lock().pending)
    }

    /// Send what is held, then read what the peer sent into `buf`: how
    /// much, 0 at the end of the stream.
    pub(crate) async fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        std::future::poll_fn(|cx| {
            let mut held = self.lock();
            ready!(held.poll_drain(cx))?;
            let mut read = ReadBuf::new(buf);
            ready!(Pin::new(&mut held.stream).poll_read(cx, &mut read))?;
            Poll::Ready(Ok(read.filled().len()))
        })
        .await
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // Nothing panics while holding it; a poisoned buffer is still bytes.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Held bytes beyond this are written at once, so the buffer stays small
/// whatever the message size.
const WRITE_BEHIND_MAX: usize = 64 * 1024;

impl WriteBehind {
    /// The stream over `inner`, and its outbox.
    pub(crate) fn new(inner: TcpStream) -> (WriteBehind, Outbox) {
        let wire = Outbox(Arc::new(Mutex::new(Held {
            stream: inner,
            pending: Vec::with_capacity(4 * 1024),
            sent: 0,
        })));
        (WriteBehind { wire: wire.clone() }, wire)
    }
}

impl Held {
    /// Write out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        // A large message's body was held whole: do not keep its room.
        if self.pending.capacity() > 2 * WRITE_BEHIND_MAX {
            self.pending.shrink_to(4 * 1024);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WriteBehind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut held = self.wire.lock();
        if held.pending.len() + buf.len() > WRITE_BEHIND_MAX {
            ready!(held.poll_drain(cx))?;
            if buf.len() > WRITE_BEHIND_MAX {
                return Pin::new(&mut held.stream).poll_write(cx, buf);
            }
        }
        held.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    /// Deferred to the next read (see the type's documentation).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut held = self.wire.lock();
        ready!(held.poll_drain(cx))?;
        Pin::new(&mut held.stream).poll_shutdown(cx)
    }
}

impl AsyncRead for WriteBehind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut held = self.wire.lock();
        ready!(held.poll_drain(cx))?;
        Pin::new(&mut held.stream).poll_read(cx, buf)
    }
}

impl AsyncTokioStream for WriteBehind {
    fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.wire.lock().stream.peer_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn write_behind_sends_what_it_holds_when_the_reply_is_awaited() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut relay, _) = listener.accept().await.unwrap();
        let (mut session, _) = WriteBehind::new(client);
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
}
