//! The worker fleet (`mailsplit workers`) against real workers, beanstalkd
//! and the scripted SMTP peer, on SQLite and PostgreSQL: each worker's
//! heartbeat names its process and binary and counts what it sent; a
//! stopping worker says so and its row goes when it exits cleanly; a
//! killed worker's row stays and turns lost; rows lost for a day are
//! forgotten when the next worker starts.

use std::time::Duration;

use crate::util::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn row_of(env: &Env, proc: &Proc) -> Option<Value> {
    let pid = i64::from(proc.0.id());
    env.workers().into_iter().find(|w| w["pid"] == pid)
}

fn short_hash_of_bin() -> String {
    let digest = Sha256::digest(std::fs::read(BIN).unwrap());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

fn fleet(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(100),
        ..Script::default()
    });
    // A killed worker turns lost after a lease: 5 s instead of 30.
    let mut env = Env::new(kind, &bs.addr()).short_lease(5_000);
    env.smtp = peer.url();

    // One worker sends a whole campaign: its row names it and its binary,
    // and counts exactly what it sent.
    // The worker's first beat waits for the hash of its binary (seconds
    // for a debug build under load): the campaign is enqueued after it,
    // so that its whole sending is seen by beats.
    // 300 messages over two sessions of 100 ms each: some 15 s of
    // sending, several beats apart even when each `workers` call is slow
    // under load.
    env.campaign_without_enqueue("first", 300);
    let mut solo = env.worker(&["--concurrency", "2"]);
    wait_for(30, "the first heartbeat", || row_of(&env, &solo).is_some());
    env.ok(&["enqueue", "first"]);
    let row = row_of(&env, &solo).unwrap();
    assert_eq!(row["state"], "running");
    assert_eq!(row["binary"], short_hash_of_bin());
    assert_eq!(row["binary_size"], std::fs::metadata(BIN).unwrap().len());
    assert_eq!(row["newest"], true);
    assert_eq!(row["concurrency"], 2);
    assert!(!row["host"].as_str().unwrap().is_empty());
    let mut saw_rate = false;
    wait_for(60, "the first campaign to finish", || {
        saw_rate |= row_of(&env, &solo).is_some_and(|r| r["rate"].as_f64().unwrap() > 0.0);
        env.status("first")["pending"] == 0
    });
    assert!(saw_rate, "a sending worker's heartbeat shows a rate");
    wait_for(10, "a heartbeat with the final count", || {
        row_of(&env, &solo).is_some_and(|r| r["sent"] == 300)
    });
    assert_eq!(peer.total(), 300);
    signal(&solo.0, "TERM");
    assert!(wait_exit(&mut solo.0, 20).success());
    assert!(env.workers().is_empty(), "a clean exit removes the row");

    // Two workers on a slow campaign.
    env.campaign("second", 400);
    let mut a = env.worker(&["--concurrency", "2", "--grace", "5"]);
    let mut b = env.worker(&["--concurrency", "2"]);
    wait_for(30, "both heartbeats", || {
        row_of(&env, &a).is_some() && row_of(&env, &b).is_some()
    });
    wait_for(30, "both to send", || {
        env.workers()
            .iter()
            .all(|w| w["sent"].as_i64().unwrap() > 0)
    });
    let text = env.ok(&["workers"]);
    assert!(text.contains("2 running, 0 stopping, 0 lost"), "{text}");
    assert!(text.contains("2 of 2 alive on the newest binary"), "{text}");

    // Told to stop, a worker says so while it finishes its jobs, then goes.
    signal(&a.0, "TERM");
    wait_for(5, "the stopping state", || {
        row_of(&env, &a).is_some_and(|r| r["state"] == "stopping")
    });
    assert!(wait_exit(&mut a.0, 30).success());
    assert!(row_of(&env, &a).is_none());

    // Killed, a worker leaves its row behind; once it is old, it is lost.
    b.0.kill().unwrap();
    b.0.wait().unwrap();
    let pid = b.0.id();
    // Three seconds of silence, without waiting them: its row as it will
    // look then (the state is judged from `seen_at` against the clock).
    env.sql(&format!(
        "UPDATE workers SET seen_at = seen_at - 3000 WHERE pid = {pid}"
    ));
    let row = row_of(&env, &b).expect("a killed worker cannot remove its row");
    assert_eq!(row["state"], "running", "not lost yet: {row}");
    env.sql(&format!(
        "UPDATE workers SET seen_at = seen_at - 20000 WHERE pid = {pid}"
    ));
    let row = row_of(&env, &b).unwrap();
    assert_eq!(row["state"], "lost");
    assert_eq!(row["rate"], 0.0);
    let text = env.ok(&["workers"]);
    assert!(text.contains("0 running, 0 stopping, 1 lost"), "{text}");

    // A new worker runs next to the lost row; a row silent for over a day
    // is forgotten by the next worker that starts.
    let c = env.worker(&["--concurrency", "2"]);
    wait_for(30, "the new heartbeat", || row_of(&env, &c).is_some());
    assert_eq!(row_of(&env, &b).unwrap()["state"], "lost");
    env.sql(&format!(
        "UPDATE workers SET seen_at = seen_at - 2 * 86400000 WHERE pid = {pid}"
    ));
    let d = env.worker(&["--concurrency", "2"]);
    wait_for(30, "the lost row to be forgotten", || {
        row_of(&env, &d).is_some() && row_of(&env, &b).is_none()
    });
    wait_done(&env, "second", 120);
    // Everyone got the mail; only what the killed worker had on the wire
    // (its --concurrency) can have gone twice.
    assert_eq!(env.status("second")["sent"], 400);
    assert!((700..=702).contains(&peer.total()), "{}", peer.total());
    drop((c, d));
}

both!(heartbeats_show_running_stopping_and_lost_workers = |kind| fleet(kind),);
