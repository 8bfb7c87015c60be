//! The worker against real beanstalkd, a scripted SMTP peer or smtp-sink,
//! and SQLite or PostgreSQL: exactly-once delivery, pause/resume/cancel,
//! transient and permanent failures, bad jobs, and clean shutdown.

use std::time::Duration;

use crate::util::*;

fn assert_counts(env: &Env, name: &str, sent: i64, failed: i64, skipped: i64) {
    let s = env.status(name);
    assert_eq!(
        (
            s["sent"].as_i64(),
            s["failed"].as_i64(),
            s["skipped"].as_i64(),
            s["pending"].as_i64()
        ),
        (Some(sent), Some(failed), Some(skipped), Some(0)),
        "{s}"
    );
}

fn delivered_once(kind: Kind, workers: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.campaign("news", 2_000);
    let procs: Vec<Proc> = (0..workers)
        .map(|_| env.worker(&["--concurrency", "20"]))
        .collect();
    wait_done(&env, "news", 120);
    assert_eq!(peer.total(), 2_000);
    assert_eq!(peer.duplicates(), 0);
    assert_eq!(peer.received.lock().unwrap().len(), 2_000);
    assert_counts(&env, "news", 2_000, 0, 0);
    wait_for(10, "every job deleted", || {
        bs.tube_stat(&env.tube, "current-jobs-ready")
            + bs.tube_stat(&env.tube, "current-jobs-reserved")
            == 0
    });
    drop(procs);
}

#[test]
fn one_worker_sends_each_recipient_once_sqlite() {
    delivered_once(Kind::Sqlite, 1);
}

fn sent(env: &Env, name: &str) -> i64 {
    env.status(name)["sent"].as_i64().unwrap()
}

/// Pause (by `pause` command or by hand in SQL), check nothing more goes
/// out, resume, and check every recipient got exactly one message.
fn pause_then_resume(kind: Kind, by_sql: bool) {
    let (_tmp, bs, peer, env) = setup(kind, slow());
    env.campaign("news", 1_500);
    let _w = env.worker(&["--concurrency", "10"]);
    wait_for(60, "some mail to go out", || sent(&env, "news") >= 100);
    if by_sql {
        env.sql("UPDATE campaigns SET paused = TRUE WHERE name = 'news'");
    } else {
        env.ok(&["pause", "news"]);
    }
    // Workers notice within a second and, once their in-flight sends have
    // landed, hand every job back with a delay.
    wait_for(30, "the worker to hand every job back", || {
        bs.tube_stat(&env.tube, "current-jobs-reserved") == 0
            && bs.tube_stat(&env.tube, "current-jobs-ready") == 0
            && bs.tube_stat(&env.tube, "current-jobs-delayed") > 0
    });
    assert_eq!(env.status("news")["state"], "paused");
    let (counted, received) = (sent(&env, "news"), peer.total());
    assert!(counted < 1_500, "paused too late: {counted}");
    // A whole round of the pause: every job comes back from its delay and
    // is handed back again, sending nothing.
    let (jobs, released) = (
        bs.tube_stat(&env.tube, "current-jobs-delayed"),
        bs.stat("cmd-release"),
    );
    wait_for(30, "every job handed back once more", || {
        bs.stat("cmd-release") >= released + jobs
    });
    assert_eq!(sent(&env, "news"), counted, "sent more while paused");
    assert_eq!(peer.total(), received, "the relay got mail while paused");
    if by_sql {
        env.sql("UPDATE campaigns SET paused = FALSE WHERE name = 'news'");
    } else {
        env.ok(&["resume", "news"]);
    }
    wait_done(&env, "news", 120);
    assert_counts(&env, "news", 1_500, 0, 0);
    assert_eq!(peer.total(), 1_500);
    assert_eq!(peer.duplicates(), 0);
}

#[test]
fn pause_and_resume_by_command() {
    pause_then_resume(Kind::Sqlite, false);
}

#[test]
fn pause_and_resume_by_sql_postgres() {
    pause_then_resume(Kind::Postgres, true);
}

#[test]
fn pause_by_sql_sqlite() {
    pause_then_resume(Kind::Sqlite, true);
}

#[test]
fn cancel_deletes_the_remaining_jobs() {
    let (_tmp, bs, peer, env) = setup(Kind::Sqlite, slow());
    env.campaign("news", 1_500);
    let _w = env.worker(&["--concurrency", "10"]);
    wait_for(60, "some mail to go out", || sent(&env, "news") >= 100);
    env.ok(&["cancel", "news"]);
    wait_for(30, "the tube to empty", || {
        [
            "current-jobs-ready",
            "current-jobs-reserved",
            "current-jobs-delayed",
        ]
        .iter()
        .all(|k| bs.tube_stat(&env.tube, k) == 0)
    });
    let s = env.status("news");
    assert_eq!(s["state"], "cancelled");
    assert!(peer.total() < 1_500, "cancel did not stop sending");
    assert_eq!(peer.total() as i64, s["sent"].as_i64().unwrap());
    assert_eq!(peer.duplicates(), 0);
}

#[test]
fn a_redelivered_job_sends_nothing_new() {
    let (_tmp, bs, peer, env) = setup(Kind::Sqlite, Script::default());
    env.campaign("news", 250);
    let w = env.worker(&[]);
    wait_done(&env, "news", 60);
    // The same jobs again, as after a lost delete or a duplicate enqueue.
    let mut c = bs.client();
    c.use_tube(&env.tube).unwrap();
    for chunk in (1..=250).collect::<Vec<i64>>().chunks(100) {
        c.put(
            &env.signed_job(1, chunk),
            10,
            Duration::ZERO,
            Duration::from_secs(30),
        )
        .unwrap();
    }
    wait_for(30, "the copies to be deleted", || {
        bs.tube_stat(&env.tube, "total-jobs") == 6
            && bs.tube_stat(&env.tube, "current-jobs-ready") == 0
            && bs.tube_stat(&env.tube, "current-jobs-reserved") == 0
    });
    assert_eq!(peer.total(), 250);
    assert_eq!(peer.duplicates(), 0);
    assert_counts(&env, "news", 250, 0, 0);
    drop(w);
}

#[test]
fn temporary_failure_is_retried_then_delivered_once() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            tempfail: Some(("user7@".into(), 1)),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.campaign("news", 50);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    assert_counts(&env, "news", 50, 0, 0);
    assert_eq!(peer.count("user7@example.test"), 1);
    assert_eq!(peer.tries.lock().unwrap()["user7@example.test"], 2);
    assert_eq!(peer.duplicates(), 0);
}

#[test]
fn temporary_failures_give_up_after_max_attempts() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            tempfail: Some(("user3@".into(), 100)),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.campaign("news", 20);
    let _w = env.worker(&["--max-attempts", "2"]);
    wait_done(&env, "news", 60);
    assert_counts(&env, "news", 19, 1, 0);
    assert_eq!(peer.tries.lock().unwrap()["user3@example.test"], 2);
}

#[test]
fn permanent_failure_is_recorded_and_not_retried() {
    let (_tmp, bs, peer, env) = setup(
        Kind::Sqlite,
        Script {
            reject: Some("user3@".into()),
            ..Script::default()
        },
    );
    env.campaign("news", 20);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    assert_counts(&env, "news", 19, 1, 0);
    // A retry would be a job still in the queue (delayed or under way).
    wait_for(10, "the queue to empty", || bs.live_jobs(&env.tube) == 0);
    assert_eq!(peer.tries.lock().unwrap()["user3@example.test"], 1);
    let mut conn = env.conn();
    let errors = mailsplit::store::deliveries::failures(&mut conn, 1, 10).unwrap();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].1.contains("550"), "{errors:?}");
}

#[test]
fn unsubscribed_recipients_are_skipped() {
    let env = World::with_peer(Kind::Sqlite, Script::default());
    let peer = env.peer();
    env.campaign("news", 30);
    // Unsubscribed after enqueue: the worker skips them.
    env.sql("UPDATE recipients SET status = 'unsubscribed' WHERE email IN ('user1@example.test', 'user2@example.test')");
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    assert_counts(&env, "news", 28, 0, 2);
    assert_eq!(peer.count("user1@example.test"), 0);
}

#[test]
fn malformed_jobs_are_buried_and_the_worker_keeps_going() {
    let (_tmp, bs, peer, env) = setup(Kind::Sqlite, Script::default());
    env.import_n("people", 10);
    env.create_campaign("news", "people", &[]);
    let mut c = bs.client();
    c.use_tube(&env.tube).unwrap();
    let many: Vec<i64> = (1..=10_000).collect();
    let db = env.identity().database_id;
    let bad: Vec<Vec<u8>> = vec![
        b"not json".to_vec(),
        // The old, unsigned format.
        br#"{"v":1,"campaign":1,"recipients":[1]}"#.to_vec(),
        // Put by hand for this database: no signature, or a made-up one.
        format!(r#"{{"v":2,"db":"{db}","campaign":1,"recipients":[1]}}"#).into_bytes(),
        format!(
            r#"{{"v":2,"db":"{db}","campaign":1,"recipients":[1],"mac":"AAAAAAAAAAAAAAAAAAAAAA"}}"#
        )
        .into_bytes(),
        env.signed_job(999, &[1]),
        env.signed_job(1, &[-4]),
        env.signed_job(1, &many),
    ];
    for body in &bad {
        c.put(body, 1, Duration::ZERO, Duration::from_secs(30))
            .unwrap();
    }
    let mut w = env.worker(&[]);
    wait_for(30, "the bad jobs to be buried", || {
        bs.tube_stat(&env.tube, "current-jobs-buried") == bad.len() as u64
    });
    env.ok(&["enqueue", "news"]);
    wait_done(&env, "news", 60);
    assert_eq!(peer.total(), 10);
    assert!(w.0.try_wait().unwrap().is_none(), "worker died");
    signal(&w.0, "TERM");
    assert!(wait_exit(&mut w.0, 20).success());
    let mut log = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("burying job"), "{log}");
    assert!(log.contains("999"), "{log}");
    assert!(log.contains("signature is missing or wrong"), "{log}");
}

#[test]
fn a_job_of_another_database_is_left_for_its_workers() {
    let (_tmp, bs, peer, env) = setup(Kind::Sqlite, Script::default());
    env.campaign("news", 20);
    // A second installation sharing the tube: same campaign id, same
    // recipient ids, its own database.
    let other = Env::new(Kind::Sqlite, &bs.addr());
    other.campaign_without_enqueue("theirs", 20);
    let mut c = bs.client();
    c.use_tube(&env.tube).unwrap();
    let foreign = c
        .put(
            &other.signed_job(1, &[1, 2, 3]),
            1,
            Duration::ZERO,
            Duration::from_secs(30),
        )
        .unwrap();
    let mut w = env.worker(&[]);
    wait_done(&env, "news", 60);
    // Ours are sent; theirs is moved, untouched, to its database's own
    // tube, where only its workers look.
    let home = mailsplit::queue::home_tube(&other.identity().database_id).unwrap();
    wait_for(10, "the foreign job to be moved", || {
        bs.tube_stat(&home, "current-jobs-ready") == 1
    });
    assert!(c.stats_job(foreign).is_err(), "the original is deleted");
    c.watch(&home).unwrap();
    let moved = c.reserve_with_timeout(Duration::ZERO).unwrap();
    assert_eq!(moved.body(), &other.signed_job(1, &[1, 2, 3])[..]);
    assert_eq!(peer.total(), 20);
    assert_counts(&env, "news", 20, 0, 0);
    signal(&w.0, "TERM");
    assert!(wait_exit(&mut w.0, 20).success());
    let mut log = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    let db = other.identity().database_id;
    assert_eq!(log.matches(&db).count(), 1, "logged once: {log}");
}

#[test]
fn sigterm_mid_campaign_loses_nothing() {
    let env = World::with_peer(Kind::Sqlite, slow());
    let peer = env.peer();
    env.campaign("news", 600);
    let mut w = env.worker(&["--concurrency", "10"]);
    wait_for(60, "some mail to go out", || sent(&env, "news") >= 50);
    signal(&w.0, "TERM");
    assert!(
        wait_exit(&mut w.0, 30).success(),
        "worker must exit 0 on SIGTERM"
    );
    let after_stop = sent(&env, "news");
    assert!(
        after_stop < 600,
        "finished before the signal; make the test slower"
    );
    assert_eq!(
        peer.total() as i64,
        after_stop,
        "every delivered message is recorded"
    );
    let _w2 = env.worker(&["--concurrency", "10"]);
    wait_done(&env, "news", 120);
    assert_eq!(peer.total(), 600);
    assert_eq!(peer.duplicates(), 0);
}

#[test]
fn short_grace_hands_back_unsent_messages() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            data_delay: Duration::from_millis(200),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.campaign("news", 300);
    let mut w = env.worker(&["--concurrency", "5", "--grace", "0"]);
    wait_for(60, "some mail to go out", || sent(&env, "news") >= 5);
    signal(&w.0, "INT");
    assert!(wait_exit(&mut w.0, 30).success());
    let _w2 = env.worker(&["--concurrency", "50"]);
    wait_done(&env, "news", 120);
    assert_eq!(peer.total(), 300);
    assert_eq!(peer.duplicates(), 0);
}

/// Copy the binary somewhere a test may replace it.
fn private_binary(dir: &std::path::Path) -> std::path::PathBuf {
    let bin = dir.join("mailsplit");
    std::fs::copy(BIN, &bin).unwrap();
    bin
}

/// Replace a binary the way a deploy does: write a new file, rename it over.
fn deploy(bin: &std::path::Path) {
    let staged = bin.with_extension("new");
    std::fs::copy(BIN, &staged).unwrap();
    std::fs::rename(&staged, bin).unwrap();
}

#[test]
fn replacing_the_binary_stops_the_worker_cleanly() {
    let env = World::with_peer(Kind::Sqlite, slow());
    let peer = env.peer();
    env.campaign("news", 400);
    let bindir = tempfile::tempdir().unwrap();
    let bin = private_binary(bindir.path());
    let mut cmd = env.cmd(&["worker", "--concurrency", "10"]);
    let mut w = Proc(
        std::process::Command::new(&bin)
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
            .current_dir(env.dir.path())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    unblock(&mut w.0);
    let _ = &mut cmd;
    wait_for(60, "some mail to go out", || sent(&env, "news") >= 20);
    deploy(&bin);
    assert!(
        wait_exit(&mut w.0, 30).success(),
        "worker must exit 0 after a deploy"
    );
    let mut log = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("executable replaced"), "{log}");
    let _w2 = env.worker(&["--concurrency", "20"]);
    wait_done(&env, "news", 120);
    assert_eq!(peer.total(), 400);
    assert_eq!(peer.duplicates(), 0);
}

fn tls_delivery(
    tls: fn(std::sync::Arc<rustls::ServerConfig>) -> PeerTls,
    scheme: &str,
    query: &str,
) {
    let tmp = tempfile::tempdir().unwrap();
    let (config, ca) = tls_identity(tmp.path());
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        tls: tls(config),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = format!(
        "{scheme}://localhost:{}?{query}ca={}",
        peer.port,
        ca.display()
    );
    env.campaign("news", 30);
    let _w = env.worker(&["--concurrency", "4"]);
    wait_done(&env, "news", 60);
    assert_counts(&env, "news", 30, 0, 0);
    assert_eq!(peer.encrypted.load(std::sync::atomic::Ordering::SeqCst), 30);
}

#[test]
fn starttls_relay() {
    tls_delivery(PeerTls::StartTls, "smtp", "tls=required&");
}

#[test]
fn implicit_tls_relay() {
    tls_delivery(PeerTls::Implicit, "smtps", "");
}

#[test]
fn tls_required_but_not_offered_sends_nothing() {
    let (_tmp, _bs, peer, mut env) = setup(Kind::Sqlite, Script::default());
    env.smtp = format!("smtp://127.0.0.1:{}?tls=required", peer.port);
    env.campaign("news", 5);
    let mut w = env.worker(&[]);
    // The worker tried the relay and refused to go on without TLS.
    Log::follow(&mut w.0).wait_line(60, "does not offer STARTTLS");
    assert_eq!(peer.total(), 0, "mail went out in clear text");
    assert_eq!(env.status("news")["sent"], 0);
    drop(w);
}

#[test]
fn resume_after_a_long_pause_sends_at_once() {
    let (_tmp, bs, _peer, env) = setup(Kind::Sqlite, slow());
    env.campaign("news", 1_500);
    let _w = env.worker(&["--concurrency", "10"]);
    wait_for(60, "some mail to go out", || sent(&env, "news") >= 100);
    env.ok(&["pause", "news"]);
    // Until paused jobs go back with delays of several seconds (the delay
    // grows with the pause): more than the 4 s resume is given below.
    wait_for(60, "a paused job delayed by 6 s or more", || {
        bs.next_delay(&env.tube) >= 6
    });
    let before = sent(&env, "news");
    let out = env.ok(&["resume", "news"]);
    assert!(out.contains("delayed jobs"), "resume kicked nothing: {out}");
    wait_for(4, "sending to start again", || {
        sent(&env, "news") > before + 50
    });
    wait_done(&env, "news", 120);
}

both!(three_workers_send_each_recipient_once = |kind| delivered_once(kind, 3),);
