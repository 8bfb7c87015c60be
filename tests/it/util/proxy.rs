//! A TCP forwarder that takes a server away and brings it back.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// A TCP forwarder to `target` on a port of its own, to take a server
/// (PostgreSQL) away and bring it back without touching the server:
/// `stop` refuses new connections and cuts the open ones, `start` listens
/// again on the same port.
pub struct TcpProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    running: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpProxy {
    pub fn start(target: std::net::SocketAddr) -> TcpProxy {
        let mut p = TcpProxy {
            port: free_port(),
            target,
            running: Arc::new(AtomicBool::new(false)),
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
                    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
                list.push(client);
                list.push(server);
            }
        }));
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
