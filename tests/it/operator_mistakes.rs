//! The exactly-once promise under an operator's ordinary mistakes and a
//! hostile queue, against the real servers (beanstalkd, smtp-sink or the
//! scripted SMTP peer, SQLite and PostgreSQL): two enqueues at once, kill
//! -9, forged jobs, the SQLite file going away, mailbox identity, a closed
//! stderr, trace logs, international domains, line limits.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;
use mailsplit::store::campaigns;
use mailsplit::store::deliveries;
use mailsplit::store::recipients;

// ---------------------------------------------------------------- helpers

fn num(env: &Env, name: &str, key: &str) -> i64 {
    env.status(name)[key].as_i64().unwrap()
}

/// Take every ready job out of the tube: (priority, body, campaign, ids).
fn drain_jobs(bs: &Beanstalkd, tube: &str) -> Vec<(u32, String, i64, Vec<i64>)> {
    bs.drain(tube)
        .into_iter()
        .map(|(pri, body)| {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let ids = v["recipients"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_i64().unwrap())
                .collect();
            (pri, body.clone(), v["campaign"].as_i64().unwrap(), ids)
        })
        .collect()
}

/// Together the jobs name each id of `all` exactly once.
fn assert_each_once(jobs: &[(u32, String, i64, Vec<i64>)], all: &[i64]) {
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, _, _, ids) in jobs {
        for &id in ids {
            *seen.entry(id).or_default() += 1;
        }
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).take(10).collect();
    assert!(
        doubled.is_empty(),
        "{} recipients in several jobs, e.g. {doubled:?}",
        seen.values().filter(|&&n| n > 1).count()
    );
    let got: BTreeSet<i64> = seen.keys().copied().collect();
    let expected: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(got.len(), expected.len());
    assert!(
        got == expected,
        "jobs name other recipients than the list's"
    );
}

/// Put bodies back into the tube, as they were.
fn put_back(bs: &Beanstalkd, tube: &str, jobs: &[(u32, String, i64, Vec<i64>)]) {
    let mut c = bs.client();
    c.use_tube(tube).unwrap();
    for (pri, body, _, _) in jobs {
        c.put(
            body.as_bytes(),
            *pri,
            Duration::ZERO,
            Duration::from_secs(30),
        )
        .unwrap();
    }
}

fn child_output(child: &mut Child) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut out).unwrap();
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err).unwrap();
    }
    (out, err)
}

/// The path of a SQLite test database.
fn sqlite_file(env: &Env) -> PathBuf {
    PathBuf::from(env.db.url.strip_prefix("sqlite://").unwrap())
}

/// Copy the binary somewhere a test may replace it or put files next to it.
fn private_binary(dir: &Path) -> PathBuf {
    let bin = dir.join("mailsplit");
    std::fs::copy(BIN, &bin).unwrap();
    bin
}

/// `cmd` (from [`Env::cmd`]) run with another executable.
fn with_binary(bin: &Path, cmd: &std::process::Command) -> std::process::Command {
    let mut c = std::process::Command::new(bin);
    c.args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))));
    if let Some(dir) = cmd.get_current_dir() {
        c.current_dir(dir);
    }
    c
}

// ------------------------------------------ one enqueue at a time

/// Two `enqueue` runs of one campaign started at the same moment (two
/// terminals, a cron overlap): every recipient in exactly one job, exact
/// counters, and after sending the campaign is done with nothing pending.
fn two_enqueues_at_once(kind: Kind) {
    const N: usize = 20_000;
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let sink = SmtpSink::start(&[]);
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = sink.url();
    env.bulk_campaign_without_enqueue("news", N);
    let all = member_ids(&env, "news");
    assert_eq!(all.len(), N);

    let mut runs: Vec<Child> = (0..2)
        .map(|_| {
            env.cmd(&["enqueue", "news"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<(String, String)> = runs
        .iter_mut()
        .map(|child| {
            let out = child_output(child);
            assert!(child.wait().unwrap().success(), "{out:?}");
            out
        })
        .collect();
    let did = outputs
        .iter()
        .filter(|(out, _)| out.contains(&format!("enqueued {N} recipients in 200 jobs")))
        .count();
    let found_done = outputs
        .iter()
        .filter(|(out, _)| out.contains("already fully enqueued"))
        .count();
    assert_eq!((did, found_done), (1, 1), "{outputs:?}");
    // When the second run met the first one at work, it said so.
    for (out, err) in &outputs {
        if out.contains("already fully enqueued") && err.contains("waiting") {
            assert!(err.contains("another `enqueue` run"), "{err}");
        }
    }

    let s = env.status("news");
    assert_eq!(
        (&s["recipients"], &s["enqueued"], &s["jobs"], &s["pending"]),
        (&N.into(), &N.into(), &200.into(), &N.into()),
        "{s}"
    );
    let jobs = drain_jobs(&bs, &env.tube);
    assert_eq!(jobs.len(), 200);
    assert_each_once(&jobs, &all);

    put_back(&bs, &env.tube, &jobs);
    let _w = env.worker(&["--concurrency", "50"]);
    wait_done(&env, "news", 300);
    let s = env.status("news");
    assert_eq!(
        (&s["state"], &s["sent"], &s["pending"]),
        (&"done".into(), &N.into(), &0.into()),
        "{s}"
    );
}

/// While another run holds the campaign, enqueue waits (saying for whom),
/// gives up after `--wait` with an error that names the fix, and goes on as
/// soon as the other run lets go.
#[test]
fn enqueue_waits_for_the_run_holding_the_campaign() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(Kind::Sqlite, &bs.addr());
    env.campaign_without_enqueue("news", 500);
    let id = env.status("news")["id"].as_i64().unwrap();
    let holder = "pid 4242 on elsewhere, run cafe";
    assert_eq!(
        campaigns::take_enqueue_lease(&mut env.conn(), id, holder).unwrap(),
        None
    );

    let started = Instant::now();
    let out = env.run(&["enqueue", "news", "--wait", "2"]);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("waiting") && err.contains(holder), "{err}");
    assert!(
        err.contains("still being enqueued by another run") && err.contains("--wait"),
        "{err}"
    );
    assert_eq!(bs.tube_stat(&env.tube, "total-jobs"), 0, "it put jobs");

    // The other run ends while this one waits: it goes on at once.
    let mut run = env
        .cmd(&["enqueue", "news"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Log::follow(&mut run);
    log.wait_line(20, "waiting");
    assert!(run.try_wait().unwrap().is_none(), "did not wait");
    campaigns::release_enqueue_lease(&mut env.conn(), id, holder).unwrap();
    let status = wait_exit(&mut run, 20);
    let (out, _) = child_output(&mut run);
    let err = log.text();
    assert!(status.success(), "{out}{err}");
    assert!(out.contains("enqueued 500 recipients in 5 jobs"), "{out}");
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-ready"), 5);
}

/// `kill -9` of a run mid-way, then a re-run: each recipient in exactly
/// one job, counters exact. A dead run on this machine is seen to be gone
/// (its pid no longer exists), so the re-run goes on at once; a run that
/// died on another machine (`elsewhere`: its lease rewritten to name one,
/// running out in 3 s) is waited out until its lease runs out.
fn enqueue_after_kill_9(kind: Kind, elsewhere: bool) {
    const N: usize = 50_000;
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.bulk_campaign_without_enqueue("news", N);
    let all = member_ids(&env, "news");
    let mut first = env
        .cmd(&["enqueue", "news"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut c = bs.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = |c: &mut beanstalkc::Beanstalkc| {
        c.stats_tube(&env.tube)
            .ok()
            .and_then(|m| m.get("current-jobs-ready")?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    while ready(&mut c) < 20 {
        assert!(Instant::now() < deadline, "the first run never got going");
        std::thread::sleep(Duration::from_millis(2));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let at_kill = ready(&mut c);
    assert!(at_kill < 500, "the first run finished before the kill");
    assert_eq!(env.status("news")["state"], "enqueuing");
    let holder = campaigns::find(&mut env.conn(), "news")
        .unwrap()
        .enqueue_owner
        .expect("the killed run left its lease");
    assert!(
        holder.starts_with(&format!("pid {} on ", first.id())),
        "{holder}"
    );
    if elsewhere {
        env.sql(&format!(
            "UPDATE campaigns SET enqueue_owner = 'pid 1 on another-machine, run 00000001', \
             enqueue_lease_until = {} WHERE name = 'news'",
            mailsplit::store::now_ms() + 3_000
        ));
    }

    let started = Instant::now();
    let out = env.run(&["enqueue", "news", "--wait", "120"]);
    let took = started.elapsed();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    eprintln!("re-run after kill -9 at {at_kill} jobs took {took:?}");
    if elsewhere {
        assert!(
            err.contains("waiting") && err.contains("another-machine"),
            "{err}"
        );
        assert!(took >= Duration::from_secs(2), "did not wait: {took:?}");
    } else {
        assert!(err.contains("is gone") && err.contains(&holder), "{err}");
        assert!(!err.contains("waiting"), "{err}");
    }
    let s = env.status("news");
    assert_eq!(
        (&s["state"], &s["recipients"], &s["enqueued"], &s["jobs"]),
        (&"sending".into(), &N.into(), &N.into(), &500.into()),
        "{s}"
    );
    let jobs = drain_jobs(&bs, &env.tube);
    assert_each_once(&jobs, &all);
}

#[test]
fn enqueue_waits_out_a_dead_remote_runs_lease_postgres() {
    enqueue_after_kill_9(Kind::Postgres, true);
}

// ------------------------------------ correctly signed, still wrong

/// Jobs signed with the database's own secret (what a bug, a stale binary
/// or a leaked secret could put) that name recipients of another list,
/// recipients that do not exist, a recipient twice, or a draft campaign:
/// nobody outside the campaign's list is mailed, nothing else is counted,
/// the draft's job is buried, and no counter goes negative.
fn signed_jobs_stay_inside_the_campaign(kind: Kind) {
    let (_tmp, bs, peer, env) = setup(kind, Script::default());
    env.campaign("news", 20);
    let news = env.status("news")["id"].as_i64().unwrap();
    // Another list (recipients 21..=25) with a draft campaign.
    let csv = env.dir.path().join("other.csv");
    std::fs::write(
        &csv,
        "email\nx1@other.test\nx2@other.test\nx3@other.test\nx4@other.test\nx5@other.test\n",
    )
    .unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "other"]);
    env.create_campaign("draft", "other", &[]);
    let draft = env.status("draft")["id"].as_i64().unwrap();
    let others = member_ids(&env, "other");
    assert_eq!(others.len(), 5);

    let mut c = bs.client();
    c.use_tube(&env.tube).unwrap();
    let bodies = [
        env.signed_job(news, &others),
        env.signed_job(news, &[999_999, 1_000_000]),
        env.signed_job(news, &[1, others[0], 424_242]),
        env.signed_job(news, &[3, 3, 3]),
        env.signed_job(draft, &others),
    ];
    for body in &bodies {
        c.put(body, 1, Duration::ZERO, Duration::from_secs(30))
            .unwrap();
    }
    let mut w = env.worker(&[]);
    wait_done(&env, "news", 60);
    wait_for(30, "every job handled", || {
        bs.tube_stat(&env.tube, "current-jobs-ready") == 0
            && bs.tube_stat(&env.tube, "current-jobs-reserved") == 0
            && bs.tube_stat(&env.tube, "current-jobs-buried") == 1
    });

    let received: BTreeSet<String> = peer.received.lock().unwrap().keys().cloned().collect();
    let expected: BTreeSet<String> = (1..=20).map(|i| format!("user{i}@example.test")).collect();
    assert_eq!(received, expected, "mail outside the campaign's list");
    assert_eq!(peer.total(), 20);
    let s = env.status("news");
    assert_eq!(
        (
            &s["recipients"],
            &s["sent"],
            &s["failed"],
            &s["skipped"],
            &s["pending"]
        ),
        (&20.into(), &20.into(), &0.into(), &0.into(), &0.into()),
        "{s}"
    );
    let mut conn = env.conn();
    let ledger = deliveries::ledger_counts(&mut conn, news).unwrap();
    assert_eq!(ledger.values().sum::<i64>(), 20, "{ledger:?}");
    assert!(deliveries::ledger_counts(&mut conn, draft)
        .unwrap()
        .is_empty());
    let d = env.status("draft");
    assert_eq!(
        (&d["state"], &d["sent"]),
        (&"draft".into(), &0.into()),
        "{d}"
    );
    for (campaign, counters) in campaigns::list(&mut conn).unwrap() {
        assert!(
            counters.pending() >= 0 && counters.sent >= 0,
            "{}: {counters:?}",
            campaign.name
        );
    }

    signal(&w.0, "TERM");
    assert!(wait_exit(&mut w.0, 20).success());
    let mut log = String::new();
    w.0.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(log.contains("not on the campaign's list"), "{log}");
    assert!(log.contains("never enqueued"), "{log}");
}

// ------------------------------- the SQLite file under the workers

/// Delete (or replace) the database file under a running worker: it stops
/// within a couple of flag refreshes with a non-zero exit and says why,
/// instead of sending on a ledger nobody can read.
fn worker_stops_when_the_file_goes(replace: bool) {
    // 10 sessions at 100 ms a message: about 100 messages a second.
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            data_delay: Duration::from_millis(100),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.campaign("news", 1_500);
    let mut w = env.worker(&["--concurrency", "10"]);
    wait_for(60, "some mail to go out", || {
        num(&env, "news", "sent") >= 50
    });
    let file = sqlite_file(&env);
    if replace {
        // A restore from a backup: a new file renamed over the old one.
        let copy = file.with_extension("restored");
        std::fs::copy(&file, &copy).unwrap();
        std::fs::rename(&copy, &file).unwrap();
    } else {
        std::fs::remove_file(&file).unwrap();
    }
    let at_change = peer.total();
    let status = wait_exit(&mut w.0, 10);
    let after = peer.total();
    assert!(!status.success(), "the worker must fail, not exit 0");
    let mut log = String::new();
    w.0.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let what = if replace {
        "was replaced"
    } else {
        "was deleted"
    };
    assert!(
        log.contains(&format!("the database file {} {what}", file.display())),
        "{log}"
    );
    // What was on the wire (10 sessions) and what started before the next
    // check (every 0.5 s, ~50 messages) may still go out; not the rest.
    assert!(
        after - at_change <= 100,
        "{} messages sent after the file went",
        after - at_change
    );
    assert!(after < 1_500, "the campaign finished anyway");
}

#[test]
fn deleting_the_database_file_stops_the_worker() {
    worker_stops_when_the_file_goes(false);
}

#[test]
fn replacing_the_database_file_stops_the_worker() {
    worker_stops_when_the_file_goes(true);
}

// ------------------------------------------------ mailbox identity

/// `Ada@Example.com` / `ada@example.com` and `user@bücher.de` /
/// `user@xn--bcher-kva.de` are one recipient each: imported once, mailed
/// once, at the spelling first imported (domain as an A-label on the wire).
fn one_mail_per_mailbox(kind: Kind) {
    let env = World::with_peer(kind, Script::default());
    let peer = env.peer();
    env.ok(&["migrate"]);
    let csv = env.dir.path().join("people.csv");
    std::fs::write(
        &csv,
        "email,name\nAda@Example.com,Ada\nada@example.com,Ada L.\nuser@bücher.de,Jo\n\
         user@xn--bcher-kva.de,Jo B.\nbob@example.com,Bob\n",
    )
    .unwrap();
    let out = env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    assert!(out.contains("added 3 / updated 0"), "{out}");
    let again = env.dir.path().join("again.csv");
    std::fs::write(&again, "email\nADA@EXAMPLE.COM\nUSER@BÜCHER.DE\n").unwrap();
    let out = env.ok(&["import", again.to_str().unwrap(), "--list", "people"]);
    assert!(out.contains("added 0 / updated 0 / unchanged 2"), "{out}");
    env.create_campaign("news", "people", &[]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    let received = peer.received.lock().unwrap().clone();
    let expected: BTreeMap<String, u32> = [
        ("Ada@example.com", 1),
        ("bob@example.com", 1),
        ("user@xn--bcher-kva.de", 1),
    ]
    .into_iter()
    .map(|(a, n)| (a.to_string(), n))
    .collect();
    assert_eq!(received.into_iter().collect::<BTreeMap<_, _>>(), expected);
    let s = env.status("news");
    assert_eq!(
        (&s["recipients"], &s["sent"]),
        (&3.into(), &3.into()),
        "{s}"
    );
}

// ---------------------------------------- stderr is a closed pipe

/// `mailsplit worker … 2>&1 | head -c1`: the reader of stderr goes away
/// after one byte. The worker (logging at debug, so every job writes) keeps
/// sending, exits 0 promptly on SIGTERM, and hands back its jobs: a second
/// worker finishes the campaign, nobody mailed twice.
#[test]
fn a_closed_stderr_never_stops_the_worker() {
    let (_tmp, bs, peer, env) = setup(Kind::Sqlite, slow());
    env.campaign("news", 600);
    let mut w = Proc(
        env.cmd(&["worker", "--concurrency", "10"])
            .env("MAILSPLIT_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut pipe = w.0.stderr.take().unwrap();
    let mut one = [0u8; 1];
    pipe.read_exact(&mut one).unwrap();
    drop(pipe);
    let closed_at = num(&env, "news", "sent");
    wait_for(60, "mail to go on after stderr closed", || {
        num(&env, "news", "sent") >= closed_at + 100
    });
    assert!(w.0.try_wait().unwrap().is_none(), "the worker died");
    signal(&w.0, "TERM");
    let status = wait_exit(&mut w.0, 20);
    assert!(status.success(), "{status:?}");
    let stopped_at = num(&env, "news", "sent");
    assert!(stopped_at < 600, "finished before the signal");
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-reserved"), 0);

    let started = Instant::now();
    let _w2 = env.worker(&["--concurrency", "10"]);
    wait_for(15, "the second worker to get the jobs", || {
        num(&env, "news", "sent") > stopped_at
    });
    eprintln!(
        "second worker started sending after {:?}",
        started.elapsed()
    );
    wait_done(&env, "news", 120);
    assert_eq!(peer.total(), 600);
    assert_eq!(peer.duplicates(), 0);
}

// ------------------------- trace logging next to the binary's file

/// `MAILSPLIT_LOG=trace` with the log file in the binary's directory: the
/// deploy watcher must not log the log file's own writes (a loop that
/// wrote 100 MB in 2 s), and a deploy is still noticed.
#[test]
fn trace_log_beside_the_binary_does_not_feed_itself() {
    let env = World::with_peer(Kind::Sqlite, Script::default());
    env.ok(&["migrate"]);
    let bindir = tempfile::tempdir().unwrap();
    let bin = private_binary(bindir.path());
    let log_path = bindir.path().join("worker.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut w = Proc(
        with_binary(&bin, &env.cmd(&["worker", "--concurrency", "2"]))
            .env("MAILSPLIT_LOG", "trace")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap(),
    );
    wait_for(20, "the worker to start", || {
        std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("worker started"))
    });
    std::thread::sleep(Duration::from_secs(3));
    let size = std::fs::metadata(&log_path).unwrap().len();
    assert!(w.0.try_wait().unwrap().is_none(), "the worker died");
    assert!(size < 1_000_000, "{size} bytes of log in 3 s");

    // Deploy: a new binary renamed over the old one still stops it.
    let staged = bin.with_extension("new");
    std::fs::copy(BIN, &staged).unwrap();
    std::fs::rename(&staged, &bin).unwrap();
    assert!(wait_exit(&mut w.0, 30).success());
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(text.contains("executable replaced"), "{text:.2000}");
    assert!(
        text.len() < 2_000_000,
        "{} bytes of log in total",
        text.len()
    );
}

// ------------------------------------------ international domains

/// A relay without SMTPUTF8: `user@bücher.de` is delivered as
/// `user@xn--bcher-kva.de`, a `--from` with an international domain works
/// end to end, and a local part that needs SMTPUTF8 is one clear
/// per-recipient failure.
#[test]
fn international_domains_through_a_relay_without_smtputf8() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            no_smtputf8: true,
            keep_data: true,
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.ok(&["migrate"]);
    let csv = env.dir.path().join("people.csv");
    std::fs::write(
        &csv,
        "email,name\nuser@bücher.de,Jo\nädä@example.test,Ädä\nplain@example.test,Plain\n",
    )
    .unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    env.ok(&[
        "campaign",
        "create",
        "news",
        "--list",
        "people",
        "--template",
        "newsletter",
        "--subject",
        "Hello",
        "--from",
        "Shop <news@exämple.com>",
    ]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    let s = env.status("news");
    assert_eq!((&s["sent"], &s["failed"]), (&2.into(), &1.into()), "{s}");
    let received: BTreeSet<String> = peer.received.lock().unwrap().keys().cloned().collect();
    assert_eq!(
        received,
        BTreeSet::from([
            "plain@example.test".to_string(),
            "user@xn--bcher-kva.de".to_string()
        ])
    );
    let senders = peer.senders.lock().unwrap().clone();
    assert_eq!(senders.len(), 2, "{senders:?}");
    assert!(
        senders.values().all(|s| s == "news@xn--exmple-cua.com"),
        "{senders:?}"
    );
    for (rcpts, text) in peer.messages.lock().unwrap().iter() {
        assert!(
            text.contains("From: Shop <news@xn--exmple-cua.com>"),
            "{text}"
        );
        assert!(text.contains(&format!("<{}>", rcpts[0])), "{text}");
    }
    let failures = deliveries::failures(&mut env.conn(), 1, 10).unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].1.contains("SMTPUTF8") && failures[0].1.contains("ädä@example.test"),
        "{failures:?}"
    );
}

// ------------------------------------ line and header length limits

/// A 2,000-character name gives no line over RFC 5322's 998.
#[test]
fn a_long_name_keeps_the_to_line_within_998() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.ok(&["migrate"]);
    let csv = env.dir.path().join("long.csv");
    let long = "a".repeat(2_000);
    std::fs::write(&csv, format!("email,name\nada@example.test,{long}\n")).unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    env.create_campaign("news", "people", &[]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    assert_eq!(env.status("news")["sent"], 1);
    let messages = peer.messages.lock().unwrap().clone();
    let (_, text) = &messages[0];
    let longest = text.lines().map(str::len).max().unwrap();
    assert!(longest <= 998, "a line of {longest} characters");
    let to = text.lines().find(|l| l.starts_with("To:")).unwrap();
    assert!(to.contains(&"a".repeat(100)), "{to}");
}

/// The 64 KB record limit holds for the header row: a 1 MB column name is
/// refused before anything is written.
#[test]
fn a_header_row_over_the_limit_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let csv = tmp.path().join("wide.csv");
    let mut text = format!("email,{}\n", "x".repeat(1 << 20));
    for i in 0..200 {
        text.push_str(&format!("user{i}@example.test,1\n"));
    }
    std::fs::write(&csv, text).unwrap();
    let out = env.run(&["import", csv.to_str().unwrap(), "--list", "wide"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("header row") && err.contains("65536"), "{err}");
    assert!(
        err.len() < 2_000,
        "the column name was echoed: {} bytes",
        err.len()
    );
    let mut conn = env.conn();
    assert!(recipients::find_list(&mut conn, "wide").is_err());
    assert_eq!(
        recipients::find_by_email(&mut conn, "user1@example.test").unwrap(),
        None
    );
}

both!(
    two_enqueues_at_once,
    enqueue_continues_at_once_after_kill_9 = |kind| enqueue_after_kill_9(kind, false),
    signed_jobs_stay_inside_the_campaign,
    one_mail_per_mailbox,
);
