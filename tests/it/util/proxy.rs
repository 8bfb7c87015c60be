//! A TCP forwarder that takes a server away and brings it back.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// A TCP forwarder to `target` on a port of its own, to take a server
/// (PostgreSQL) away and bring it back without touching the server:
/// `stop` refuses new connections and cuts the open ones, `start` listens
/// again on the same port. `freeze` is a partition instead: connections
/// stay open and new ones are accepted, but nothing is carried either way
/// (no refusal, no RST: what a DROP rule does) until `thaw`, when what was
/// held goes through, as TCP retransmissions would.
pub struct TcpProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    running: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
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
        let frozen = self.frozen.clone();
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
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    let frozen = frozen.clone();
                    std::thread::spawn(move || carry(from, to, &frozen));
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

/// Copy `from` to `to`, holding each chunk while `frozen`.
fn carry(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
