//! The accept loop of each listener, in place of `axum::serve`, so that a
//! slow or idle client cannot hold what others need (many connections
//! sending half a header would otherwise starve `/healthz`, unsubscribes
//! and the admin API, and hold SIGTERM up):
//!
//! - a connection must deliver a whole request header within
//!   [`HEADER_READ_TIMEOUT`] of its first byte, and a connection with no
//!   request in flight that sends nothing is closed after
//!   [`IDLE_TIMEOUT`] (new ones and kept-alive ones alike);
//! - each listener holds at most `--max-connections`; when a new one
//!   arrives at the cap, the connection idle longest (no request in
//!   flight: a half-sent header, a kept-alive one) is closed to make room,
//!   so a flood of slow clients cannot keep a real request out;
//! - on SIGTERM, connections without a request in flight close at once,
//!   requests in flight get [`SHUTDOWN_GRACE`], then everything is dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Longest a client may take to send a request header, from its first byte.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection with no request in flight may stay silent.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest requests in flight may take to finish once SIGTERM came.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// After a failed accept (out of file descriptors), wait this long.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Let this process open `wanted` files and sockets if its hard limit
/// allows (the usual soft limit of 1,024 is less than two listeners'
/// default caps); a warning when it cannot.
pub fn raise_file_limit(wanted: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    let wanted = wanted as libc::rlim_t;
    if !got || limit.rlim_cur >= wanted {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: wanted.min(limit.rlim_max),
        rlim_max: limit.rlim_max,
    };
    // SAFETY: as above.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0;
    if !set || raised.rlim_cur < wanted {
        tracing::warn!(
            open_files = raised.rlim_cur,
            wanted,
            "cannot raise the open-file limit to what --max-connections needs"
        );
    }
}

/// What the accept loop knows of one connection. Times are ms since the
/// listener's start, plus 1 (0 means "none").
struct Slot {
    busy: AtomicUsize,
    /// When the connection last became idle (accepted, or a response done).
    idle_since: AtomicU64,
    /// When the first byte arrived since then (a header being sent).
    head_since: AtomicU64,
    evict: CancellationToken,
}

struct Registry {
    start: Instant,
    next: AtomicU64,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
}

impl Registry {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms.saturating_sub(1))
    }

    /// When a connection's silence or slowness runs out; `None` while a
    /// request is in flight (the handlers bound their own work).
    fn deadline(&self, slot: &Slot) -> Option<Instant> {
        if slot.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        match slot.head_since.load(Ordering::Acquire) {
            0 => Some(self.at(slot.idle_since.load(Ordering::Acquire)) + IDLE_TIMEOUT),
            head => Some(self.at(head) + HEADER_READ_TIMEOUT),
        }
    }

    /// Close the connection idle longest; false when every one is busy.
    fn evict_one(&self) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = slots
            .values()
            .filter(|s| s.busy.load(Ordering::Acquire) == 0 && !s.evict.is_cancelled())
            .min_by_key(|s| s.idle_since.load(Ordering::Acquire));
        match oldest {
            Some(s) => {
                s.evict.cancel();
                true
            }
            None => false,
        }
    }
}

/// Serve `router` on `listener` until `stop`, then shut down within
/// [`SHUTDOWN_GRACE`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    stop: CancellationToken,
) {
    let registry = Arc::new(Registry {
        start: Instant::now(),
        next: AtomicU64::new(0),
        slots: Mutex::new(HashMap::new()),
    });
    let room = Arc::new(Semaphore::new(max_connections.max(1)));
    let tracker = TaskTracker::new();
    loop {
        let (socket, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let permit = match Arc::clone(&room).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if !registry.evict_one() {
                    tracing::warn!(
                        max_connections,
                        "connection cap reached, every connection busy"
                    );
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    p = Arc::clone(&room).acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                }
            }
        };
        let (registry, router, stop) = (Arc::clone(&registry), router.clone(), stop.clone());
        tracker.spawn(async move {
            connection(socket, peer, router, &registry, stop).await;
            drop(permit);
        });
    }
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = tracker.len(),
            "requests still in flight cut at shutdown"
        );
    }
}

/// Marks a request in flight from its header to its response.
struct Busy {
    slot: Arc<Slot>,
    registry: Arc<Registry>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.slot.head_since.store(0, Ordering::Release);
        self.slot
            .idle_since
            .store(self.registry.now(), Ordering::Release);
        self.slot.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn connection(
    socket: TcpStream,
    peer: SocketAddr,
    router: Router,
    registry: &Arc<Registry>,
    stop: CancellationToken,
) {
    let (id, slot) = registry.register();
    let app = TowerToHyperService::new(router);
    let (s, r) = (Arc::clone(&slot), Arc::clone(registry));
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        s.busy.fetch_add(1, Ordering::AcqRel);
        let busy = Busy {
            slot: Arc::clone(&s),
            registry: Arc::clone(&r),
        };
        req.extensions_mut().insert(ConnectInfo(peer));
        let answer = app.call(req);
        async move {
            let answer = answer.await;
            drop(busy);
            answer
        }
    });
    let io = TokioIo::new(Watched {
        io: socket,
        slot: Arc::clone(&slot),
        registry: Arc::clone(registry),
    });
    let mut conn = pin!(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
    let mut stopping = false;
    loop {
        let wake = registry
            .deadline(&slot)
            .unwrap_or_else(|| Instant::now() + IDLE_TIMEOUT);
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = slot.evict.cancelled() => break,
            _ = stop.cancelled(), if !stopping => {
                // Nothing in flight: nothing to finish.
                if slot.busy.load(Ordering::Acquire) == 0 {
                    break;
                }
                conn.as_mut().graceful_shutdown();
                stopping = true;
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if registry.deadline(&slot).is_some_and(|d| d <= Instant::now()) {
                    break;
                }
            }
        }
    }
    registry
        .slots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
}

impl Registry {
    /// A new connection's slot, under a fresh id.
    fn register(&self) -> (u64, Arc<Slot>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.now()),
            head_since: AtomicU64::new(0),
            evict: CancellationToken::new(),
        });
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&slot));
        (id, slot)
    }
}

/// The client's socket, noting when a request header starts to arrive.
struct Watched {
    io: TcpStream,
    slot: Arc<Slot>,
    registry: Arc<Registry>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before && self.slot.busy.load(Ordering::Acquire) == 0 {
            let now = self.registry.now();
            let _ =
                self.slot
                    .head_since
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
