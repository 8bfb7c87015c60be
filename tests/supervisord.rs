//! The deploy story under a real supervisord, with the repository's own
//! `scripts/supervisord.conf`: replace the binary mid-campaign, the workers
//! exit 0, supervisord starts them on the new binary, and the campaign
//! completes with nothing lost or doubled.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// supervisord in the foreground; stopped politely (so it stops its
/// workers) when dropped.
struct Supervisor(Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        signal(&self.0, "TERM");
        let _ = wait_exit(&mut self.0, 60);
    }
}

fn worker_starts(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mailsplit-worker")
        })
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .matches("worker started")
                .count()
        })
        .sum()
}

#[test]
fn deploy_under_supervisord_completes_the_campaign() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(40),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    env.campaign("news", 3_000);

    let run = tmp.path().join("run");
    std::fs::create_dir_all(run.join("bin")).unwrap();
    let bin = run.join("bin/mailsplit");
    std::fs::copy(BIN, &bin).unwrap();
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/supervisord.conf");
    let _sup = Supervisor(
        Command::new("supervisord")
            .args(["-n", "-c", conf])
            .env("MAILSPLIT_BIN", &bin)
            .env("MAILSPLIT_WORKERS", "2")
            .env("MAILSPLIT_DIR", &run)
            .env("DATABASE_URL", &env.db.url)
            .env("BEANSTALKD", &env.beanstalkd)
            .env("MAILSPLIT_TUBE", &env.tube)
            .env("SMTP_URL", &env.smtp)
            .env("MAILSPLIT_CONCURRENCY", "10")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("supervisord is not installed: run scripts/install-deps.sh"),
    );
    let sent = || env.status("news")["sent"].as_i64().unwrap();
    wait_for(60, "both workers to start", || worker_starts(&run) >= 2);
    wait_for(60, "some mail to go out", || sent() >= 300);

    // A deploy: the new binary is renamed over the old one.
    let staged = run.join("bin/mailsplit.new");
    std::fs::copy(BIN, &staged).unwrap();
    std::fs::rename(&staged, &bin).unwrap();

    wait_for(60, "supervisord to restart both workers", || {
        worker_starts(&run) >= 4
    });
    assert!(
        sent() < 3_000,
        "the campaign finished before the deploy; slow the peer down"
    );
    wait_for(180, "the campaign to finish", || {
        env.status("news")["pending"] == 0
    });
    assert_eq!(peer.total(), 3_000);
    assert_eq!(peer.duplicates(), 0);
    let logs: String = std::fs::read_dir(&run)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mailsplit-worker")
        })
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert_eq!(logs.matches("executable replaced").count(), 2, "{logs}");
}
