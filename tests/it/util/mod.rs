//! Test helpers: real servers on free ports (beanstalkd, Postfix's
//! smtp-sink, a scripted SMTP peer for faults), a fresh SQLite file or
//! PostgreSQL database per test, and a builder for running the binary.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_mailsplit");

/// `both!(scenario, …)`: for each `fn scenario(Kind)`, a `#[test]` per
/// backend, `sqlite::scenario` and `postgres::scenario`. An entry may name
/// the test apart from the function and pass more arguments:
/// `both!(three_workers_send_each_recipient_once = |kind| delivered_once(kind, 3))`.
/// One `both!` per area (it makes the area's `sqlite` and `postgres` modules).
#[macro_export]
macro_rules! both {
    ($($name:ident $(= |$k:ident| $e:expr)?),* $(,)?) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $( #[test] fn $name() { $crate::both!(@run super::Kind::Sqlite, $name $(, $k, $e)?) } )*
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $( #[test] fn $name() { $crate::both!(@run super::Kind::Postgres, $name $(, $k, $e)?) } )*
        }
    };
    (@run $kind:expr, $name:ident) => {
        super::$name($kind)
    };
    (@run $kind:expr, $name:ident, $k:ident, $e:expr) => {{
        let $k = $kind;
        $e
    }};
}

/// A port on 127.0.0.1 that nothing listens on now and that no other
/// test process is handed while this one runs.
///
/// Why not the kernel's `bind(0)`: its ports come from the ephemeral
/// range, where a port let go can be handed to another test process's
/// next `bind(0)`, or taken as the source port of an outgoing connection,
/// before the server it was meant for binds it. A beanstalkd then exits
/// "address in use" at once, `wait_port` finds the other test's server on
/// the port, and the test talks to a stranger until that one stops. Here
/// a port comes from below the ephemeral range, where neither hands ports
/// out, and is reserved by an exclusive `flock` on a file of its own under
/// the temporary directory (`mailsplit-test-ports-UID`), held until this
/// process exits (the kernel lets it go even after a kill -9).
pub fn free_port() -> u16 {
    let (low, high) = port_range();
    let span = u32::from(high - low);
    let start = rand::random::<u32>() % span;
    for i in 0..span {
        let port = low + ((start + i) % span) as u16;
        let Some(lock) = reserve_port(port) else {
            continue;
        };
        // Nothing else on the machine (a service of its own) listens there.
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            PORT_LOCKS.lock().unwrap().push(lock);
            return port;
        }
    }
    panic!("no free port in {low}..{high}: every one is in use or reserved by a running test");
}

/// Where the kernel's ephemeral range starts (`ip_local_port_range`,
/// 32768 by default).
pub fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768)
}

/// Ports `free_port` hands out: the 12,000 below the start of the
/// kernel's ephemeral range.
fn port_range() -> (u16, u16) {
    let low = ephemeral_start();
    assert!(
        low > 13_024,
        "the ephemeral port range starts at {low}: free_port needs 12,000 ports below it, above 1024"
    );
    (low - 12_000, low)
}

/// The reservations this process holds: their files stay open (and
/// locked) until it exits.
static PORT_LOCKS: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());

/// An exclusive lock on `port`'s file, or `None` if another test (in this
/// process or any other: a `flock` belongs to its open file) holds it.
pub fn reserve_port(port: u16) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        // Per user: a directory another user made would not let this one in.
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let dir = std::env::temp_dir().join(format!("mailsplit-test-ports-{uid}"));
        std::fs::create_dir_all(&dir).expect("create the port reservations' directory");
        dir
    });
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .expect("open a port reservation file");
    // SAFETY: flock on a descriptor this File owns and keeps open.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    locked.then_some(file)
}

/// Wait until something accepts TCP connections on `port`.
pub fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait for `cond` for up to `secs` seconds.
pub fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed when dropped.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Send a signal to a child.
pub fn signal(child: &Child, sig: &str) {
    Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
}

/// Wait for a child to exit, up to `secs`; returns its status.
pub fn wait_exit(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not exit within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run `cmd` to completion like `Command::output`, but kill it and fail
/// the test if it is still running after `secs` (a command that should
/// refuse at once must not hang a test when it does not).
pub fn output_within(cmd: &mut Command, secs: u64) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still running after {secs} s; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// Taken by every test whose assertions are rates measured at a peer: under
/// `cargo test` they run one at a time (scripts/test.sh's fallback runs
/// limiter:: and connections:: on one thread, after the rest); under
/// nextest, where each test is a process, `.config/nextest.toml` gives them
/// every thread (`nextest_runs_every_alone_test_alone` checks it names them).
pub fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE.lock().unwrap_or_else(|p| p.into_inner())
}

mod beanstalkd;
mod db;
mod env;
mod http;
mod log;
mod mysql;
pub mod postfix;
mod proxy;
mod smtp;
mod world;

pub use beanstalkd::*;
pub use db::*;
pub use env::*;
pub use http::*;
pub use log::*;
pub use mysql::*;
pub use postfix::{bounce_fixtures, postfix_dsn};
pub use proxy::*;
pub use smtp::*;
pub use world::*;
