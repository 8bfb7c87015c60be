//! `rate set mx:SUFFIX`: one shared rate for every recipient domain whose
//! preferred MX host ends in SUFFIX, the MX asked of a local DNS server
//! (tests/support/dns_server.py) through the workers' `--resolver`, once
//! per domain and worker, not per message; a domain whose lookup fails
//! goes in its own group.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::doctor::Dns;
use crate::util::*;

/// A worker on `resolver` whose log goes to `name`.log in the test's
/// directory.
fn worker(env: &Env, name: &str, resolver: &str) -> Proc {
    let log = std::fs::File::create(env.dir.path().join(format!("{name}.log"))).unwrap();
    Proc(
        env.cmd(&[
            "worker",
            "--smtp",
            &env.smtp,
            "--concurrency",
            "20",
            "--resolver",
            resolver,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap(),
    )
}

fn read_logs(dir: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    out
}

/// Import `domains[i % len]` recipients, `user{i}@…`, as list `list`, set
/// `rates` (group, rate, burst), create and enqueue campaign `list`.
fn campaign(env: &Env, list: &str, n: usize, domains: &[&str], rates: &[(&str, &str, &str)]) {
    env.ok(&["migrate"]);
    let mut rows = String::from("email\n");
    for i in 0..n {
        rows.push_str(&format!("user{i}@{}\n", domains[i % domains.len()]));
    }
    let csv = env.dir.path().join("people.csv");
    std::fs::write(&csv, rows).unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", list]);
    for &(group, rate, burst) in rates {
        env.ok(&["rate", "set", group, rate, "--burst", burst]);
    }
    env.create_campaign(list, list, &[]);
    env.ok(&["enqueue", list]);
}

/// Most accepted in any 1 s window starting at an accept.
fn peak(times: &[Instant]) -> usize {
    let mut best = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while j < times.len() && times[j] < times[i] + Duration::from_secs(1) {
            j += 1;
        }
        best = best.max(j - i);
    }
    best
}

fn accepted(peer: &ScriptedSmtp, domains: &[&str]) -> Vec<Instant> {
    let mut t: Vec<Instant> = peer
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, a)| domains.iter().any(|d| a.ends_with(&format!("@{d}"))))
        .map(|(t, _)| *t)
        .collect();
    t.sort();
    t
}

/// one.test and two.test (different names, MX hosts under mailhost.test)
/// share `mx:mailhost.test`'s 20/s; free.test (MX elsewhere) runs free
/// beside them. Per-domain groups would let the pair go at 40/s (or free:
/// no group names them); a rollup that held every domain would hold
/// free.test at 20/s too.
#[test]
fn an_mx_rollup_holds_two_domains_to_its_shared_rate_while_a_third_runs_free() {
    let _alone = crate::util::alone();
    let tmp = tempfile::tempdir().unwrap();
    let zone = tmp.path().join("zone.json");
    let questions = tmp.path().join("questions.log");
    std::fs::write(
        &zone,
        json!({
            "one.test": {"MX": [[10, "mx1.eu.mailhost.test"], [20, "backup.elsewhere.test"]]},
            "two.test": {"MX": [[5, "MX2.mailhost.test"]]},
            "free.test": {"MX": [[10, "mx.notmailhost.test"]]},
        })
        .to_string(),
    )
    .unwrap();
    let dns = Dns::start_logged(&zone, Some(&questions));
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    // 100 at one.test, 100 at two.test, 300 at free.test, mixed in every job.
    campaign(
        &env,
        "mx",
        500,
        &[
            "one.test",
            "free.test",
            "two.test",
            "free.test",
            "free.test",
        ],
        &[("mx:mailhost.test", "20/s", "2")],
    );
    let list = env.ok(&["rate", "list"]);
    assert!(list.contains("mx:mailhost.test"), "{list}");
    let _w: Vec<Proc> = (0..2)
        .map(|i| worker(&env, &format!("w{i}"), &dns.addr()))
        .collect();
    wait_done(&env, "mx", 120);
    let pair = accepted(&peer, &["one.test", "two.test"]);
    let one = accepted(&peer, &["one.test"]);
    let two = accepted(&peer, &["two.test"]);
    let free = accepted(&peer, &["free.test"]);
    assert_eq!((one.len(), two.len(), free.len()), (100, 100, 300));
    assert_eq!(peer.duplicates(), 0);
    let pair_peak = peak(&pair);
    // Over the first 150 (the last ones come from deferred jobs' delays).
    let pair_rate = 150.0 / (pair[150] - pair[0]).as_secs_f64();
    let free_peak = peak(&free);
    eprintln!(
        "one+two.test (mx:mailhost.test 20/s): {pair_rate:.1}/s, peak {pair_peak} in 1 s; free.test peak {free_peak} in 1 s, done {:.1} s after the pair's first",
        (free[free.len() - 1] - pair[0]).as_secs_f64()
    );
    assert!(
        pair_peak <= 22,
        "one.test and two.test together held {pair_peak} in 1 s, over 20/s + burst 2\n{}",
        read_logs(env.dir.path())
    );
    assert!(
        pair_rate >= 0.75 * 20.0,
        "one.test and two.test only {pair_rate:.1}/s together"
    );
    // Both domains go through the group from the start, neither waits for
    // the other to finish.
    assert!(one[0] < two[two.len() - 1] && two[0] < one[one.len() - 1]);
    // free.test: no group, so faster than the pair's shared 20/s, all of
    // it done while the pair still had half to go (5 s of their 10).
    assert!(
        free[free.len() - 1] < pair[100],
        "free.test was held back with the rollup's domains"
    );
    // One question per domain and worker, not per message.
    let asked = std::fs::read_to_string(&questions).unwrap_or_default();
    for d in ["one.test", "two.test", "free.test"] {
        let n = asked.lines().filter(|l| *l == format!("{d} MX")).count();
        assert!((1..=2).contains(&n), "{d} asked {n} times:\n{asked}");
    }
}

/// A lookup that fails (nothing answers at the resolver's address) leaves
/// the domain in its own group: one.test's mail goes at `domain:*`'s rate,
/// not held by the rollup's 1/h that its MX would have put it under.
fn a_failed_mx_lookup_leaves_the_domain_in_its_own_group(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    campaign(
        &env,
        "fallback",
        30,
        &["one.test"],
        &[
            ("mx:mailhost.test", "1/h", "1"),
            ("domain:*", "100/s", "10"),
        ],
    );
    let nobody = format!("127.0.0.1:{}", free_port());
    let _w = worker(&env, "w", &nobody);
    wait_done(&env, "fallback", 60);
    assert_eq!(accepted(&peer, &["one.test"]).len(), 30);
    wait_for(15, "the failed lookup in the log", || {
        read_logs(env.dir.path()).contains("MX lookup")
    });
    let logs = read_logs(env.dir.path());
    assert!(
        logs.contains("the domain's own rate group applies"),
        "{logs}"
    );
    let list = env.ok(&["rate", "list"]);
    assert!(list.contains("mx:mailhost.test"), "{list}");
}

both!(a_failed_mx_lookup_leaves_the_domain_in_its_own_group);
