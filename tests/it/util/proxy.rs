//! A TCP forwarder that takes a server away and brings it back.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// A TCP forwarder to `target` on a port of its own, to take a server
/// (PostgreSQL) away and bring it back without touching the server:
/// `stop` refuses new connections and cuts the open ones, `start` listens
/// again on the same port. `freeze` is a partition instead: connections
/// stay open and new ones are accepted, but nothing is carried either way
/// (no refusal, no RST: what a DROP rule does) until `thaw`, when what was
/// held goes through, as TCP retransmissions would. `swallow` then `reset`
/// is a dead switch, or a proxy, that stops forwarding and comes back
/// having lost its state: nothing is carried and nothing is closed (new
/// connections are accepted and swallowed too), what was sent meanwhile is
/// gone (it was acknowledged, so nobody sends it again), and after the heal
/// each connection of before is reset on both sides as soon as either side
/// sends something on it. A connection where both sides wait for the
/// other (a query whose bytes were swallowed) is never reset.
pub struct TcpProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    running: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    swallowing: Arc<AtomicBool>,
    /// Bumped by each reset: connections born before it are reset when
    /// next used.
    epoch: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpProxy {
    pub fn start(target: std::net::SocketAddr) -> TcpProxy {
        let mut p = TcpProxy {
            port: free_port(),
            target,
            running: Arc::new(AtomicBool::new(false)),
            frozen: Arc::new(AtomicBool::new(false)),
            swallowing: Arc::new(AtomicBool::new(false)),
            epoch: Arc::new(AtomicU64::new(0)),
            conns: Default::default(),
            thread: None,
        };
        p.resume();
        p
    }

    /// Listen (again).
    pub fn resume(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        self.running.store(true, Ordering::SeqCst);
        let (running, conns, target) = (self.running.clone(), self.conns.clone(), self.target);
        let (frozen, swallowing) = (self.frozen.clone(), self.swallowing.clone());
        let epoch = self.epoch.clone();
        self.thread = Some(std::thread::spawn(move || {
            while running.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let mut list = conns.lock().unwrap();
                let born = epoch.load(Ordering::SeqCst);
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    let faults = Faults {
                        frozen: frozen.clone(),
                        swallowing: swallowing.clone(),
                        epoch: epoch.clone(),
                        born,
                    };
                    std::thread::spawn(move || carry(from, to, &faults));
                }
                list.push(client);
                list.push(server);
            }
        }));
    }

    /// Carry nothing, silently, until [`TcpProxy::thaw`].
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Carry again, starting with what was held.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }

    /// Carry nothing and close nothing, both ways, dropping what is sent,
    /// until [`TcpProxy::reset`].
    pub fn swallow(&self) {
        self.swallowing.store(true, Ordering::SeqCst);
    }

    /// End a swallow: connections opened from now on are carried; each one
    /// of before is reset on both sides (an RST to the client and to the
    /// server) the next time either side sends on it.
    pub fn reset(&self) {
        let _conns = self.conns.lock().unwrap();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.swallowing.store(false, Ordering::SeqCst);
    }

    /// Refuse connections and cut the open ones.
    pub fn stop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Abort a connection: the peer gets an RST, whatever other handles to the
/// socket exist (a `connect` to `AF_UNSPEC` disconnects a TCP socket with a
/// reset, where `close` would wait for its duplicates and `shutdown` sends a
/// FIN).
fn abort(c: &TcpStream) {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed sockaddr with family AF_UNSPEC, its own size given.
    let rc = unsafe {
        let mut addr: libc::sockaddr = std::mem::zeroed();
        addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            c.as_raw_fd(),
            &addr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
}

/// What one direction of a connection obeys.
struct Faults {
    frozen: Arc<AtomicBool>,
    swallowing: Arc<AtomicBool>,
    epoch: Arc<AtomicU64>,
    /// The epoch when the connection was opened.
    born: u64,
}

/// Copy `from` to `to`, holding each chunk while `frozen`, dropping it
/// while `swallowing`, and resetting both sides at the first chunk after a
/// reset of a connection opened before it.
fn carry(mut from: TcpStream, mut to: TcpStream, f: &Faults) {
    let Faults {
        frozen,
        swallowing,
        epoch,
        born,
    } = f;
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if swallowing.load(Ordering::SeqCst) {
            // A close is swallowed too: the other side never hears of it.
            if n == 0 {
                return;
            }
            continue;
        }
        if epoch.load(Ordering::SeqCst) > *born {
            abort(&from);
            abort(&to);
            return;
        }
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
