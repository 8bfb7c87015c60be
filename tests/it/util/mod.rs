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

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
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
