//! Issue 29, items 4 to 6: what a careless operator or a hostile client
//! could do to memory, threads and sockets through `rate set` and
//! `serve`, against the real servers (beanstalkd, smtp-sink, SQLite) and
//! real sockets (a "beanstalkd" that accepts and never answers, clients
//! that send half a header).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

// ---------------------------------------------------------------- helpers

/// A process's resident memory in KiB and its thread count, from
/// /proc/PID/status; `None` once it is gone.
fn rss_and_threads(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("Threads:")?))
}

fn fails(out: &std::process::Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}\n{}",
        stdout(out),
        stderr(out)
    );
    stderr(out)
}

// ------------------------------------------------- item 4: rate bounds

/// `rate set` refuses what made every worker allocate a slot per token
/// (10¹²/s: 14 GB; 10⁹/s: 804 MB), rates under one a day, bursts over the
/// maximum and `domain:` groups that name no domain, each with exit 2
/// naming the bound; a slow rate is shown as it was given.
#[test]
fn rate_set_refuses_rates_and_bursts_past_the_maximums() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    for rate in ["1e12/s", "1e9/s", "100001/s", "6000001/m"] {
        let err = fails(&env.run(&["rate", "set", "domain:example.test", rate]), 2);
        assert!(err.contains("maximum of 100000/s"), "{rate}: {err}");
    }
    for rate in ["1e-300/s", "1e-9/s", "0.5/d"] {
        let err = fails(&env.run(&["rate", "set", "domain:example.test", rate]), 2);
        assert!(err.contains("1/d"), "{rate}: {err}");
    }
    let err = fails(
        &env.run(&[
            "rate",
            "set",
            "domain:example.test",
            "10/s",
            "--burst",
            "100001",
        ]),
        2,
    );
    assert!(err.contains("maximum of 100000"), "{err}");
    let err = fails(
        &env.run(&["rate", "set", "domain:<i>x</i>.test", "10/s"]),
        2,
    );
    assert!(err.contains("not a domain"), "{err}");
    // Nothing of that was stored.
    assert!(env.ok(&["rate", "list"]).starts_with("no rate groups"));

    // The bounds themselves are accepted, and shown as given.
    let said = env.ok(&["rate", "set", "domain:slow.test", "1/h"]);
    assert!(said.contains("domain:slow.test: 1/h, burst 1"), "{said}");
    env.ok(&["rate", "set", "domain:daily.test", "1/d"]);
    let said = env.ok(&[
        "rate",
        "set",
        "domain:fast.test",
        "100000/s",
        "--burst",
        "100000",
    ]);
    assert!(said.contains("100000/s, burst 100000"), "{said}");
    let list = env.ok(&["rate", "list"]);
    for (group, shown) in [
        ("domain:slow.test", " 1/h "),
        ("domain:daily.test", " 1/d "),
        ("domain:fast.test", " 100000/s "),
    ] {
        let line = list.lines().find(|l| l.starts_with(group)).unwrap();
        let limit = line.split("limit").nth(1).unwrap();
        assert!(
            limit.starts_with(&format!("{:>12}", shown.trim_end())),
            "{line}"
        );
    }
}

/// A worker sending under the maximal allowed rate and burst, and under a
/// rate written into the table by hand far past it (10⁹/s with the burst
/// of 10⁸ the old `rate set` gave it: 804 MB in the issue), keeps its
/// memory flat: tokens are leased a few thousand at a time and held as
/// runs, never one slot each. Afterwards the group's schedule is not
/// pushed minutes into the future.
#[test]
fn a_worker_under_the_maximal_rate_keeps_flat_memory() {
    const N: usize = 3_000;
    /// Resident memory a worker may reach (it sits near 20 MB).
    const BOUND_KIB: u64 = 150 * 1024;
    let (_tmp, _bs, mut env) = env_with_beanstalkd(Kind::Sqlite);
    let sink = SmtpSink::start(&[]);
    env.smtp = sink.url();
    env.campaign_without_enqueue("big", N);
    env.ok(&[
        "rate",
        "set",
        "campaign:big",
        "100000/s",
        "--burst",
        "100000",
    ]);
    env.ok(&["rate", "set", "domain:example.test", "10/s"]);
    env.sql(
        "UPDATE rate_groups SET rate = 1e9, burst = 100000000 WHERE name = 'domain:example.test'",
    );
    env.ok(&["enqueue", "big"]);
    let mut worker = env.worker(&[]);
    let pid = worker.0.id();
    let started = Instant::now();
    let mut peak = 0;
    loop {
        if let Some((rss, _)) = rss_and_threads(pid) {
            peak = peak.max(rss);
        }
        if peak > BOUND_KIB {
            let _ = worker.0.kill();
            panic!("worker grew to {} MB", peak / 1024);
        }
        if env.status("big")["pending"] == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "campaign did not finish"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = stop_worker(worker);
    eprintln!("{N} messages, worker peak RSS {} MB", peak / 1024);
    assert_eq!(env.status("big")["sent"], N as u64, "{log}");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    for g in mailsplit::store::rates::list(&mut env.conn()).unwrap() {
        let ahead = Duration::from_micros((g.tat - now_us).max(0) as u64);
        assert!(
            ahead < Duration::from_secs(5),
            "{}: {ahead:?} ahead",
            g.name
        );
    }
}

// --------------------------------------- item 5: a hung beanstalkd

/// A "beanstalkd" that accepts every connection and never answers,
/// holding each open; returns its address and the count of connections
/// it accepted.
fn hung_beanstalkd() -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    (addr, accepted)
}

/// The one-click path of a recipient of campaign `name` (its token signed
/// as `enqueue` would sign it).
fn one_click_path(env: &Env, name: &str, list: &str) -> String {
    let campaign = mailsplit::store::campaigns::find(&mut env.conn(), name)
        .unwrap()
        .id;
    let recipient = member_ids(env, list)[0];
    let token = env.identity().signer.unsubscribe_token(campaign, recipient);
    format!("/u/{token}")
}

const ADMIN_TOKEN: &str = "a-hardening-test-token-0123456789";

/// Issue 29 item 5: with a beanstalkd that accepts and never answers and
/// a dashboard polled hard for 15 s, `serve`'s threads stay bounded, a
/// one-click unsubscribe is still answered at once, the dashboard still
/// answers (saying the server did not answer), and `/healthz` is not 200.
#[test]
fn a_hung_beanstalkd_and_a_busy_dashboard_starve_nothing() {
    let (hung, accepted) = hung_beanstalkd();
    let env = Env::new(Kind::Sqlite, &hung);
    env.campaign_without_enqueue("news", 3);
    let path = one_click_path(&env, "news", "news");
    let served = env.serve(Some(ADMIN_TOKEN));
    let (admin, public, pid) = (served.admin, served.public, served.proc.0.id());
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let until = Instant::now() + Duration::from_secs(15);
    let pollers: Vec<_> = (0..12)
        .map(|_| {
            let auth = auth.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                while Instant::now() < until {
                    let r = http("GET", admin, "/live", &[("Authorization", &auth)], None);
                    answers.push((
                        r.status,
                        r.body.contains("did not answer") || r.body.contains("no answer"),
                    ));
                }
                answers
            })
        })
        .collect();
    let mut peak_threads = 0;
    while Instant::now() < until {
        if let Some((_, threads)) = rss_and_threads(pid) {
            peak_threads = peak_threads.max(threads);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(peak_threads <= 32, "serve grew to {peak_threads} threads");
    // While the dashboard is still being polled: an unsubscribe goes through.
    let started = Instant::now();
    let r = http(
        "POST",
        public,
        &path,
        &[],
        Some("List-Unsubscribe=One-Click"),
    );
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(took < Duration::from_secs(5), "one-click took {took:?}");
    let health = http("GET", public, "/healthz", &[], None);
    assert_eq!(health.status, 503, "{}", health.body);
    assert!(
        health.body.contains(&format!("beanstalkd {hung}")),
        "{}",
        health.body
    );
    let answers: Vec<_> = pollers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();
    eprintln!(
        "{} dashboard polls, peak {peak_threads} threads, {} connections to the hung server, one-click in {took:?}",
        answers.len(),
        accepted.load(Ordering::SeqCst)
    );
    assert!(
        answers.iter().all(|&(status, _)| status == 200),
        "{answers:?}"
    );
    assert!(
        answers.iter().any(|&(_, said)| said),
        "the dashboard never said the server is silent"
    );
}
