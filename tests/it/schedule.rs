//! Scheduling: `--send-at` on `campaign create` and
//! `campaign edit`. Against the real binary, beanstalkd, Postfix's
//! smtp-sink (each accepted message dumped to a file, so the sink itself
//! says what arrived, when, and for whom), SQLite and PostgreSQL. A
//! scheduled campaign sends nothing before its time and every recipient
//! exactly once after; moving the time later holds the jobs back, moving
//! it earlier brings them at once; cancel and delete before the start
//! drop its jobs; a past time is refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::util::*;

const N: usize = 30;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn at(ms: i64) -> String {
    mailsplit::clock::rfc3339(ms, mailsplit::clock::Precision::AsNeeded)
}

/// smtp-sink dumping every message into `dir` (one file each).
fn sink(dir: &Path) -> SmtpSink {
    std::fs::create_dir_all(dir).unwrap();
    // smtp-sink writes as `nobody`.
    let mut perms = std::fs::metadata(dir).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o777);
    std::fs::set_permissions(dir, perms).unwrap();
    let template = format!("{}/%H%M%S.", dir.display());
    SmtpSink::start(&["-d", &template])
}

/// What arrived at the sink: messages per recipient, and the earliest and
/// latest time a message was written (ms since the epoch).
struct Arrived {
    per_rcpt: HashMap<String, usize>,
    first: Option<i64>,
    last: Option<i64>,
}

fn arrived(dir: &Path) -> Arrived {
    let mut a = Arrived {
        per_rcpt: HashMap::new(),
        first: None,
        last: None,
    };
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let Some(rcpt) = text
            .lines()
            .find_map(|l| l.strip_prefix("X-Rcpt-Args: <"))
            .and_then(|r| r.split('>').next())
        else {
            continue; // still being written
        };
        *a.per_rcpt.entry(rcpt.to_string()).or_default() += 1;
        let written = std::fs::metadata(&f)
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        a.first = Some(a.first.map_or(written, |x: i64| x.min(written)));
        a.last = Some(a.last.map_or(written, |x: i64| x.max(written)));
    }
    a
}

fn total(dir: &Path) -> usize {
    arrived(dir).per_rcpt.values().sum()
}

/// Every list member got exactly one message.
fn exactly_once(dir: &Path) -> Arrived {
    let a = arrived(dir);
    assert_eq!(a.per_rcpt.len(), N, "{:?}", a.per_rcpt);
    for i in 1..=N {
        let rcpt = format!("user{i}@example.test");
        assert_eq!(a.per_rcpt.get(&rcpt), Some(&1), "{rcpt}: {:?}", a.per_rcpt);
    }
    a
}

fn create_at(env: &Env, name: &str, send_at: i64) -> String {
    env.create_campaign(name, "news", &["--send-at", &at(send_at)])
}

/// The campaign's jobs, wherever they are (delayed, ready, reserved).
fn wait_all_sent(env: &Env, name: &str, dir: &Path) {
    wait_done(env, name, 60);
    wait_for(10, "every message at the sink", || total(dir) >= N);
}

fn nothing_before_its_time(kind: Kind) {
    let (tmp, bs, mut env) = env_with_beanstalkd(kind);
    let dir = tmp.path().join("sink");
    let sink = sink(&dir);
    env.smtp = sink.url();
    env.import_n("news", N);
    // Far ahead first: however slow this machine is, the jobs are put
    // before the start.
    let far = now_ms() + 3_600_000;
    let out = create_at(&env, "spring", far);
    assert!(
        out.contains(&format!("no message leaves before {}", at(far))),
        "{out}"
    );
    let status = env.status("spring");
    assert_eq!(status["state"], "scheduled");
    assert_eq!(status["send_at"], at(far));
    let text = env.ok(&["status", "spring"]);
    assert!(text.contains("not enqueued yet"), "{text}");

    // Enqueue before the time: the jobs wait in beanstalkd, delayed.
    env.ok(&["enqueue", "spring", "--batch-size", "10"]);
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-delayed"), 3);
    assert_eq!(env.status("spring")["state"], "scheduled");
    // Pause and resume work before the start.
    env.ok(&["pause", "spring"]);
    assert_eq!(env.status("spring")["state"], "paused");
    env.ok(&["resume", "spring"]);
    assert_eq!(env.status("spring")["state"], "scheduled");
    // Then a start a few seconds ahead.
    let start = now_ms() + 4_000;
    env.ok(&["campaign", "edit", "spring", "--send-at", &at(start)]);

    let worker = env.worker(&[]);
    // Up to the time: nothing at the sink, nothing in the ledger.
    while now_ms() < start - 300 {
        assert_eq!(total(&dir), 0, "a message left before the start");
        assert_eq!(env.status("spring")["sent"], 0);
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_all_sent(&env, "spring", &dir);
    let a = exactly_once(&dir);
    assert!(a.first.unwrap() >= start, "a message left before the start");
    let status = env.status("spring");
    assert_eq!(status["sent"], N as i64);
    assert_eq!(status["state"], "done");
    drop(worker);
    // The worker started after the resume's and the edit's kicks, so each
    // of the 3 jobs met the start early at most once and went back once
    // (none if the worker came up after the start), not in a loop.
    let released = bs.stat("cmd-release");
    assert!(released <= 3, "{released} releases of 3 jobs");
}

fn moved_later_then_earlier(kind: Kind) {
    let (tmp, bs, mut env) = env_with_beanstalkd(kind);
    let dir = tmp.path().join("sink");
    let sink = sink(&dir);
    env.smtp = sink.url();
    env.import_n("news", N);
    let first = now_ms() + 10_000;
    create_at(&env, "spring", first);
    env.ok(&["enqueue", "spring", "--batch-size", "10"]);
    let _worker = env.worker(&[]);

    // Later: the jobs come at the first time and go back until the new one.
    let later = now_ms() + 60_000;
    let out = env.ok(&["campaign", "edit", "spring", "--send-at", &at(later)]);
    assert!(
        out.contains(&format!("now starts at {}", at(later))),
        "{out}"
    );
    assert!(
        !out.contains("content version"),
        "a schedule edit stores no version: {out}"
    );
    assert_eq!(env.status("spring")["content_version"], 1);
    wait_for(20, "the jobs to come at the old time and go back", || {
        now_ms() > first && bs.stat("cmd-release") >= 3
    });
    let jobs = 3;
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-delayed"), jobs);
    assert_eq!(total(&dir), 0, "sent at the old time");
    assert_eq!(env.status("spring")["state"], "scheduled");
    // Each job met the old time once and went back once.
    let released_at_old_time = bs.stat("cmd-release");
    assert_eq!(released_at_old_time, jobs, "a job went back twice");

    // Earlier: the edit makes the delayed jobs ready; they wait for the
    // new time only, not the old one.
    let earlier = now_ms() + 2_000;
    env.ok(&["campaign", "edit", "spring", "--send-at", &at(earlier)]);
    wait_all_sent(&env, "spring", &dir);
    let a = exactly_once(&dir);
    assert!(
        a.first.unwrap() >= earlier,
        "a message left before the start"
    );
    assert!(a.last.unwrap() < later, "the earlier time was not taken");
    // The edit kicks each of the delayed jobs once (not again after a
    // worker has sent it back for the new time); a kicked job that meets
    // the new time early goes back once more.
    let released = bs.stat("cmd-release");
    assert!(
        released <= released_at_old_time + jobs,
        "{released} releases: a job went back more than once per time it met early"
    );
}

fn cancel_and_delete_before_the_start(kind: Kind) {
    let (tmp, bs, mut env) = env_with_beanstalkd(kind);
    let dir = tmp.path().join("sink");
    let sink = sink(&dir);
    env.smtp = sink.url();
    env.import_n("news", N);

    // A time in the past, or not a time: refused, exit 2.
    for bad in ["2020-01-01T00:00:00Z", "tomorrow 9am"] {
        let out = env.try_create_campaign("late", "news", &["--send-at", bad]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("--send-at"), "{}", stderr(&out));
    }

    let start = now_ms() + 3_600_000;
    create_at(&env, "cancelled", start);
    create_at(&env, "deleted", start);
    env.ok(&["enqueue", "cancelled", "--batch-size", "10"]);
    env.ok(&["enqueue", "deleted", "--batch-size", "10"]);
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-delayed"), 6);
    env.ok(&["cancel", "cancelled"]);
    env.ok(&["campaign", "delete", "deleted"]);
    assert_eq!(env.status("cancelled")["state"], "cancelled");
    let out = env.run(&["status", "deleted"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));

    // The hour passes (the jobs made ready by hand): every job dropped,
    // none buried, nothing sent.
    let mut c = bs.client();
    c.use_tube(&env.tube).unwrap();
    assert_eq!(c.kick(100).unwrap(), 6);
    let worker = env.worker(&[]);
    wait_for(30, "every job of both campaigns dropped", || {
        bs.live_jobs(&env.tube) == 0
    });
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-buried"), 0);
    assert_eq!(total(&dir), 0, "a cancelled or deleted campaign sent mail");
    let log = stop_worker(worker);
    assert!(log.contains("deleted before its start"), "{log}");
}

both!(
    nothing_before_its_time,
    moved_later_then_earlier,
    cancel_and_delete_before_the_start
);
