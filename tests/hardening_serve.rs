//! Issue 29, items 4 to 6: what a careless operator or a hostile client
//! could do to memory, threads and sockets through `rate set` and
//! `serve`, against the real servers (beanstalkd, smtp-sink, SQLite) and
//! real sockets (a "beanstalkd" that accepts and never answers, clients
//! that send half a header).

mod common;

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
