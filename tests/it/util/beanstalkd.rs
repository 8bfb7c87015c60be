//! beanstalkd on a free port, with a binlog; killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::*;

pub struct Beanstalkd {
    pub port: u16,
    pub binlog: PathBuf,
    proc: Option<Proc>,
}

impl Beanstalkd {
    pub fn start(dir: &Path) -> Beanstalkd {
        let mut b = Beanstalkd {
            port: free_port(),
            binlog: dir.join(format!("binlog-{}", free_port())),
            proc: None,
        };
        std::fs::create_dir_all(&b.binlog).unwrap();
        b.restart();
        b
    }
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    pub fn stop(&mut self) {
        self.proc = None;
    }
    /// Start again on the same port with the same binlog.
    pub fn restart(&mut self) {
        self.proc = None;
        let child = Command::new("beanstalkd")
            .args(["-l", "127.0.0.1", "-p", &self.port.to_string(), "-b"])
            .arg(&self.binlog)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("beanstalkd is not installed: run scripts/install-deps.sh");
        self.proc = Some(Proc(child));
        wait_port(self.port);
    }
    /// Start again on the same port with its binlog gone: every job is
    /// lost, as after a restart of a beanstalkd run without one.
    pub fn restart_empty(&mut self) {
        self.stop();
        std::fs::remove_dir_all(&self.binlog).unwrap();
        std::fs::create_dir_all(&self.binlog).unwrap();
        self.restart();
    }
    pub fn client(&self) -> beanstalkc::Beanstalkc {
        beanstalkc::Beanstalkc::new()
            .host("127.0.0.1")
            .port(self.port)
            .connect()
            .unwrap()
    }
    /// `stats-tube` counters of a tube (0 when the tube does not exist).
    pub fn tube_stat(&self, tube: &str, key: &str) -> u64 {
        match self.client().stats_tube(tube) {
            Ok(m) => m.get(key).and_then(|v| v.parse().ok()).unwrap_or(0),
            Err(_) => 0,
        }
    }
    /// A server-wide `stats` counter (e.g. `cmd-release`).
    pub fn stat(&self, key: &str) -> u64 {
        let stats = self.client().stats().expect("beanstalkd stats");
        stats.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
    /// The longest delay (seconds) of the next delayed job of `tube`, as
    /// `stats-job` reports it; 0 when none is delayed.
    pub fn next_delay(&self, tube: &str) -> u64 {
        let mut c = self.client();
        if c.use_tube(tube).is_err() {
            return 0;
        }
        let id = match c.peek_delayed() {
            Ok(job) => job.id(),
            Err(_) => return 0,
        };
        c.stats_job(id)
            .ok()
            .and_then(|m| m.get("delay")?.parse().ok())
            .unwrap_or(0)
    }
    /// Jobs of `tube` in any state but buried: ready, reserved or delayed.
    pub fn live_jobs(&self, tube: &str) -> u64 {
        [
            "current-jobs-ready",
            "current-jobs-reserved",
            "current-jobs-delayed",
        ]
        .iter()
        .map(|k| self.tube_stat(tube, k))
        .sum()
    }
    /// Reserve and delete every ready job of `tube`, returning the bodies.
    pub fn drain(&self, tube: &str) -> Vec<(u32, String)> {
        let mut c = self.client();
        c.watch(tube).unwrap();
        c.ignore("default").unwrap();
        let mut out = Vec::new();
        while let Ok((id, body)) = c
            .reserve_with_timeout(Duration::ZERO)
            .map(|job| (job.id(), String::from_utf8(job.body().to_vec()).unwrap()))
        {
            let pri = c
                .stats_job(id)
                .unwrap()
                .get("pri")
                .and_then(|p| p.parse().ok())
                .unwrap();
            c.delete(id).unwrap();
            out.push((pri, body));
        }
        out
    }
}
