//! Messages on the workers' pooled SMTP sessions: within `--concurrency`
//! while a campaign sends, and their job kept while a slow relay holds one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mailsplit::store::messages::MessageStatus;

use super::{send, templates, wait_status};
use crate::util::*;

/// A campaign keeps both sessions of a `--concurrency 2` worker busy while
/// ten messages are submitted: the relay never sees a third session (a
/// message with a connect of its own would open one beside the campaign's),
/// and every message and every recipient arrives once.
fn messages_share_the_sessions(kind: Kind) {
    let w = World::with_peer(
        kind,
        Script {
            data_delay: Duration::from_millis(20),
            ..Script::default()
        },
    );
    templates(&w);
    w.bulk_campaign_without_enqueue("big", 300);
    w.ok(&["enqueue", "big"]);
    let worker = w.worker(&["--concurrency", "2"]);
    wait_for(60, "the campaign under way", || w.peer().total() >= 20);
    let ids: Vec<i64> = (0..10)
        .map(|i| send(&w, "order", &format!("m{i}@example.org"), &[]).0)
        .collect();
    for &id in &ids {
        wait_status(&w, id, MessageStatus::Sent, 60);
    }
    wait_done(&w, "big", 120);
    stop_worker(worker);
    let peak = w.peer().peak_connections.load(Ordering::SeqCst);
    assert!(peak <= 2, "{peak} sessions at once with --concurrency 2");
    let received = w.peer().received.lock().unwrap().clone();
    for i in 0..10 {
        assert_eq!(received.get(&format!("m{i}@example.org")), Some(&1));
    }
    assert_eq!(w.peer().total(), 310);
}

/// The relay holds DATA's answer for longer than the job's TTR (a short
/// lease here): the worker keeps the job and its claim alive, so the
/// message is recorded `sent` once, and its job is never reserved again.
fn a_slow_relay_keeps_the_job(kind: Kind) {
    let w = World::with_peer(
        kind,
        Script {
            data_delay: Duration::from_secs(7),
            ..Script::default()
        },
    )
    .var("MAILSPLIT_LEASE_MS", "3000");
    templates(&w);
    let (id, _) = send(&w, "order", "ada@example.org", &[]);
    let worker = w.worker(&[]);
    let v = wait_status(&w, id, MessageStatus::Sent, 30);
    // Its job was never handed out again: once the message is recorded the
    // tube is empty (a second reserve would have found the claim busy and
    // put the job back, delayed).
    wait_for(5, "the message's job deleted", || {
        [
            "current-jobs-ready",
            "current-jobs-delayed",
            "current-jobs-reserved",
        ]
        .iter()
        .all(|k| w.bs.tube_stat(&w.tube, k) == 0)
    });
    stop_worker(worker);
    assert!(v.sent_at.is_some(), "{v:?}");
    assert_eq!(
        w.peer().tries.lock().unwrap().get("ada@example.org"),
        Some(&1)
    );
}

both!(messages_share_the_sessions, a_slow_relay_keeps_the_job);
