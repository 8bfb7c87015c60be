//! `mailsplit requeue` after beanstalkd lost a campaign's jobs, and
//! auto-pause against a relay that refuses everything: the campaign stops
//! after a bounded number of failures, says why, and finishes with
//! `resume` and `requeue --failed` once the relay is fixed.

use std::time::Duration;

use crate::util::*;
use mailsplit::store::{campaigns, deliveries, DeliveryState};

/// The counters equal a `COUNT(*)` over the ledger.
fn assert_counters_match_ledger(env: &Env, name: &str) {
    let mut conn = env.conn();
    let c = campaigns::find(&mut conn, name).unwrap();
    let counters = campaigns::counters(&mut conn, c.id).unwrap();
    let ledger = deliveries::ledger_counts(&mut conn, c.id).unwrap();
    let n = |s| *ledger.get(&s).unwrap_or(&0);
    assert_eq!(
        (counters.sent, counters.failed, counters.skipped),
        (
            n(DeliveryState::Sent),
            n(DeliveryState::Failed),
            n(DeliveryState::Skipped)
        ),
        "{ledger:?}"
    );
}

fn requeue_after_the_queue_is_lost(kind: Kind) {
    const N: usize = 1_200;
    const CONCURRENCY: usize = 10;
    let tmp = tempfile::tempdir().unwrap();
    let mut bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(15),
        ..Script::default()
    });
    // The killed workers' claims wait out a lease before anyone may decide
    // them: 5 s instead of 30.
    let mut env = Env::new(kind, &bs.addr()).short_lease(5_000);
    env.smtp = peer.url();
    env.campaign("news", N);
    let concurrency = CONCURRENCY.to_string();
    {
        let _workers: Vec<Proc> = (0..2)
            .map(|_| env.worker(&["--concurrency", &concurrency]))
            .collect();
        wait_for(60, "a third sent", || {
            env.status("news")["sent"].as_i64().unwrap() >= (N / 3) as i64
        });
        // Dropping the workers kills them with SIGKILL, mid-send.
    }
    // beanstalkd restarted without its binlog: every job is gone.
    bs.stop();
    std::fs::remove_dir_all(&bs.binlog).unwrap();
    std::fs::create_dir_all(&bs.binlog).unwrap();
    bs.restart();
    let pending = env.status("news")["pending"].as_i64().unwrap();
    assert!(pending > 0);
    assert!(env
        .ok(&["enqueue", "news"])
        .contains("already fully enqueued"));
    // Nothing would ever send the rest: requeue.
    let out = env.ok(&["requeue", "news"]);
    assert!(
        out.contains(&format!("requeued {pending} recipients")),
        "{out}"
    );
    // Twice is harmless.
    env.ok(&["requeue", "news", "--batch-size", "37"]);
    let workers: Vec<Proc> = (0..2)
        .map(|_| env.worker(&["--concurrency", &concurrency]))
        .collect();
    // And again while workers run (they have sent something).
    wait_for(60, "the workers to send", || {
        env.status("news")["sent"].as_i64() > Some(0)
    });
    env.ok(&["requeue", "news"]);
    wait_done(&env, "news", 120);
    let s = env.status("news");
    assert_eq!(
        (s["sent"].as_i64(), s["failed"].as_i64()),
        (Some(N as i64), Some(0)),
        "{s}"
    );
    // Every recipient at least once; a second copy only for messages that
    // were on the wire when the workers were killed.
    assert_eq!(peer.received.lock().unwrap().len(), N);
    let dups = peer.duplicates();
    assert!(dups <= 2 * CONCURRENCY, "{dups} duplicates");
    assert_counters_match_ledger(&env, "news");
    // The extra jobs find their recipients finished and are deleted.
    wait_for(30, "the tube to empty", || {
        bs.tube_stat(&env.tube, "current-jobs-ready")
            + bs.tube_stat(&env.tube, "current-jobs-reserved")
            + bs.tube_stat(&env.tube, "current-jobs-delayed")
            == 0
    });
    drop(workers);
}

#[test]
fn requeue_refuses_what_it_cannot_do() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(Kind::Sqlite, &bs.addr());
    env.campaign_without_enqueue("news", 3);
    let out = env.run(&["requeue", "news"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("mailsplit enqueue news"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.run(&["requeue", "nope"]).status.code(), Some(2));
    env.ok(&["enqueue", "news"]);
    env.ok(&["cancel", "news"]);
    assert_eq!(env.run(&["requeue", "news"]).status.code(), Some(2));
}

/// A relay that refuses everything (relay access denied): the workers
/// pause the campaign after 100 failures in a row, status says why; after
/// the fix, resume and requeue --failed send everyone exactly once.
fn auto_pause_then_finish(kind: Kind) {
    const N: usize = 600;
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let broken = ScriptedSmtp::start(Script {
        reject_every: Some(1),
        reject_reply: Some("554 5.7.1 <x>: Relay access denied".into()),
        ..Script::default()
    });
    let fixed = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = broken.url();
    env.campaign("news", N);
    {
        let _w = env.worker(&["--concurrency", "5"]);
        wait_for(60, "auto-pause", || env.status("news")["state"] == "paused");
        let at_pause = env.status("news")["failed"].as_i64().unwrap();
        // Stopped within what was already on its way: the messages on the
        // wire when the pause was written (at most --concurrency) may still
        // be recorded; then nothing more.
        wait_for(30, "the worker to hand every job back", || {
            bs.tube_stat(&env.tube, "current-jobs-reserved") == 0
                && bs.tube_stat(&env.tube, "current-jobs-ready") == 0
                && bs.tube_stat(&env.tube, "current-jobs-delayed") > 0
        });
        let failed = env.status("news")["failed"].as_i64().unwrap();
        assert!(
            failed - at_pause <= 5,
            "{} failures recorded after the pause, more than the 5 in flight",
            failed - at_pause
        );
        // A whole round of the pause: every job back from its delay and
        // handed back again, recording no failure.
        let (jobs, released) = (
            bs.tube_stat(&env.tube, "current-jobs-delayed"),
            bs.stat("cmd-release"),
        );
        wait_for(30, "every job handed back once more", || {
            bs.stat("cmd-release") >= released + jobs
        });
        let s = env.status("news");
        assert_eq!(
            s["failed"].as_i64().unwrap(),
            failed,
            "still failing while paused: {s}"
        );
        assert!((100..=150).contains(&failed), "{s}");
        let reason = s["pause_reason"].as_str().unwrap();
        assert!(
            reason.contains("failures in a row")
                && reason.contains("5.7.1 <x>: Relay access denied"),
            "{reason}"
        );
        assert_eq!(s["bounced"], 0, "a policy refusal is no bounce");
        let human = env.ok(&["status", "news"]);
        assert!(human.contains("paused (auto-paused: "), "{human}");
        assert!(human.contains("mailsplit requeue news --failed"), "{human}");
    }
    // The fix: a relay that works.
    env.smtp = fixed.url();
    env.ok(&["resume", "news"]);
    let out = env.ok(&["requeue", "news", "--failed"]);
    assert!(
        out.contains("failed deliveries to active recipients will be tried again"),
        "{out}"
    );
    let _w = env.worker(&["--concurrency", "5"]);
    wait_done(&env, "news", 120);
    let s = env.status("news");
    assert_eq!(
        (
            s["sent"].as_i64(),
            s["failed"].as_i64(),
            s["state"].as_str()
        ),
        (Some(N as i64), Some(0), Some("done")),
        "{s}"
    );
    assert_eq!(s["pause_reason"], serde_json::Value::Null);
    assert_eq!(fixed.received.lock().unwrap().len(), N);
    assert_eq!(fixed.duplicates(), 0);
    assert_counters_match_ledger(&env, "news");
}

/// A third of the messages refused: no streak of 100, but the failure rate
/// passes 20 % and pauses the campaign; with `--max-failure-rate off` it
/// runs to the end.
#[test]
fn failure_rate_pauses_unless_turned_off() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        reject_every: Some(3),
        reject_reply: Some("550 5.7.1 spam".into()),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    env.import_n("news", 900);
    env.create_campaign("strict", "news", &[]);
    env.create_campaign("lenient", "news", &["--max-failure-rate", "off"]);
    env.ok(&["enqueue", "strict"]);
    env.ok(&["enqueue", "lenient"]);
    let w = env.worker(&["--concurrency", "5"]);
    wait_for(60, "strict paused", || {
        env.status("strict")["state"] == "paused"
    });
    let s = env.status("strict");
    assert!(
        s["pause_reason"].as_str().unwrap().contains("of the last"),
        "{s}"
    );
    assert!(s["pending"].as_i64().unwrap() > 300, "{s}");
    wait_done(&env, "lenient", 120);
    assert_eq!(env.status("lenient")["state"], "done");
    drop(w);
    // A pause by hand carries no auto-pause reason.
    env.ok(&["resume", "strict"]);
    env.ok(&["pause", "strict"]);
    assert_eq!(
        env.status("strict")["pause_reason"],
        serde_json::Value::Null
    );
}

both!(requeue_after_the_queue_is_lost, auto_pause_then_finish);
