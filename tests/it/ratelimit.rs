//! Shared rate limits across worker processes, checked at the SMTP peer:
//! no one-second window over rate + burst, and the limit is used (≥ 90 %).

use std::time::{Duration, Instant};

use crate::util::*;

/// A fresh beanstalkd, a scripted SMTP peer that accepts everything, and
/// an environment (its database on `kind`) that sends to it.
struct Rig {
    env: Env,
    peer: ScriptedSmtp,
    bs: Beanstalkd,
    _tmp: tempfile::TempDir,
}

fn rig(kind: Kind) -> Rig {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    Rig {
        env,
        peer,
        bs,
        _tmp: tmp,
    }
}

/// Most accepted in any window of `len` starting at an accept.
fn max_in_window(times: &[Instant], len: Duration) -> usize {
    let mut best = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while j < times.len() && times[j] < times[i] + len {
            j += 1;
        }
        best = best.max(j - i);
    }
    best
}

fn times_of(peer: &ScriptedSmtp, filter: impl Fn(&str) -> bool) -> Vec<Instant> {
    let mut t: Vec<Instant> = peer
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, a)| filter(a))
        .map(|(t, _)| *t)
        .collect();
    t.sort();
    t
}

/// Accepts in the `len` after the first accept plus `skip`.
fn count_between(times: &[Instant], skip: Duration, len: Duration) -> usize {
    let start = times[0] + skip;
    times
        .iter()
        .filter(|&&t| t >= start && t < start + len)
        .count()
}

fn xact_commits(env: &Env) -> i64 {
    use diesel::prelude::*;
    let name = env.db.url.rsplit('/').next().unwrap().to_string();
    let mut c = diesel::PgConnection::establish(&format!("{}/test", pg_base())).unwrap();
    diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = '{name}'"
    ))
    .get_result(&mut c)
    .unwrap()
}

fn three_workers_hold_a_relay_limit(kind: Kind) {
    let _alone = crate::util::alone();
    let Rig {
        env,
        peer,
        bs: _bs,
        _tmp,
    } = rig(kind);
    env.import_n("news", 2_600);
    env.ok(&[
        "rate",
        "set",
        &format!("relay:127.0.0.1:{}", peer.port),
        "200/s",
        "--burst",
        "20",
    ]);
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let before = (kind == Kind::Postgres).then(|| xact_commits(&env));
    let started = Instant::now();
    let _w: Vec<Proc> = (0..3)
        .map(|i| logged_worker(&env, &format!("w{i}"), &["--concurrency", "50"]))
        .collect();
    wait_done(&env, "news", 120);
    let wall = started.elapsed();
    let times = times_of(&peer, |_| true);
    assert_eq!(times.len(), 2_600);
    assert_eq!(peer.duplicates(), 0);
    // Windows that begin in the first second (the workers' sessions still
    // opening), and the rest.
    let upto = |secs| times.partition_point(|&t| t < times[0] + Duration::from_secs(secs));
    let cut = upto(1);
    let start = max_in_window(&times[..upto(2)], Duration::from_secs(1));
    let peak = max_in_window(&times[cut..], Duration::from_secs(1));
    let steady = count_between(&times, Duration::from_secs(1), Duration::from_secs(10));
    let per_second: Vec<usize> = (0..12)
        .map(|k| count_between(&times, Duration::from_secs(k), Duration::from_secs(1)))
        .collect();
    eprintln!("per second: {per_second:?}");
    eprintln!(
        "relay limit 200/s burst 20, 3 workers: peak 1 s window {peak} (from the first second: {start}), 10 s average {:.1}/s",
        steady as f64 / 10.0
    );
    if let Some(before) = before {
        let commits = xact_commits(&env) - before;
        eprintln!(
            "database: {commits} transactions in {:.1} s = {:.0}/s (ledger, claims, flags and token leases)",
            wall.as_secs_f64(),
            commits as f64 / wall.as_secs_f64()
        );
    }
    // The bucket grants at most rate + burst in any second, but the peer
    // sees the grants after their sessions' round trips: a grant late in
    // one second may land early in the next. Allow 50 ms of that jitter
    // (10 messages); three workers each keeping 200/s would show 600.
    assert!(
        peak <= 230,
        "a 1 s window held {peak} messages, over rate + burst + 50 ms of jitter"
    );
    // While the sessions open, messages that have their tokens wait for a
    // session and go out together when it is greeted: on this 2-core
    // machine windows from the first second held 205-242, later ones 193-209.
    // Allowed: up to a second burst on top; a worker that kept its own
    // 200/s would still show 400 and more.
    assert!(
        start <= 250,
        "a 1 s window from the first second held {start} messages, over rate + 2 bursts + 50 ms of jitter"
    );
    assert!(
        steady >= 1_800,
        "only {steady} messages in 10 s: the limit is not used\n{}",
        logs(&env)
    );
    let list = env.ok(&["rate", "list"]);
    assert!(list.contains("limit       200/s"), "{list}");
}

/// A worker whose log goes to a file in the test's directory (a piped
/// stderr nobody reads would fill up on a long run with many jobs).
fn logged_worker(env: &Env, name: &str, extra: &[&str]) -> Proc {
    let log = std::fs::File::create(env.dir.path().join(format!("{name}.log"))).unwrap();
    let mut args = vec!["worker", "--smtp", &env.smtp];
    args.extend_from_slice(extra);
    Proc(
        env.cmd(&args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The workers' logs, for a failing assertion.
fn logs(env: &Env) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(env.dir.path()).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {}\n", p.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// Import `n` recipients, `user{i}@{domain(i)}`, as list `list`.
fn import_domains(env: &Env, list: &str, n: usize, domain: impl Fn(usize) -> &'static str) {
    let csv = env.dir.path().join(format!("{list}.csv"));
    let mut rows = String::from("email,name\n");
    for i in 0..n {
        rows.push_str(&format!("user{i}@{},User {i}\n", domain(i)));
    }
    std::fs::write(&csv, rows).unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", list]);
}

/// A rig on SQLite with campaign `name` enqueued: `n` recipients,
/// `user{i}@{domain(i)}`, on a list of the same name, under the rate groups
/// `rates` (`(group, rate, burst)`) set before the enqueue.
fn enqueued(
    name: &str,
    n: usize,
    domain: impl Fn(usize) -> &'static str,
    rates: &[(&str, &str, &str)],
) -> Rig {
    let rig = rig(Kind::Sqlite);
    rig.env.ok(&["migrate"]);
    import_domains(&rig.env, name, n, domain);
    for &(group, rate, burst) in rates {
        rig.env.ok(&["rate", "set", group, rate, "--burst", burst]);
    }
    rig.env.create_campaign(name, name, &[]);
    rig.env.ok(&["enqueue", name]);
    rig
}

/// Issue 16's mix: every job holds both domains, a third at slow.test and
/// two thirds at fast.test. The rates (20/s and 150/s) are not in the mix's
/// 1:2 proportion, so a design that couples the domains (senders waiting for
/// slow.test tokens while fast.test mail waits behind them) shows fast.test
/// near 2 × 20 = 40/s instead of 150/s. Then slow.test is raised to 3×
/// mid-run and the new rate must show within 3 s.
#[test]
fn a_slow_domain_does_not_slow_the_others() {
    let _alone = crate::util::alone();
    let (n_slow, n_fast) = (1_000, 2_000);
    // Domains in mixed case: groups match whatever the case.
    let Rig {
        env,
        peer,
        bs: _bs,
        _tmp,
    } = enqueued(
        "mixed",
        n_slow + n_fast,
        |i| if i % 3 == 0 { "Slow.Test" } else { "fast.test" },
        &[
            ("domain:slow.test", "20/s", "2"),
            ("domain:FAST.test", "150/s", "15"),
        ],
    );
    let _w: Vec<Proc> = (0..3)
        .map(|i| logged_worker(&env, &format!("w{i}"), &["--concurrency", "20"]))
        .collect();
    wait_for(60, "the first messages", || {
        !peer.log.lock().unwrap().is_empty()
    });
    let first = peer.log.lock().unwrap()[0].0;
    // Mid-run (fast.test needs about 13 s): slow.test to 3×.
    std::thread::sleep((first + Duration::from_secs(8)).saturating_duration_since(Instant::now()));
    let status = env.ok(&["status"]);
    env.ok(&["rate", "set", "domain:slow.test", "60/s", "--burst", "6"]);
    let raised = Instant::now();
    wait_done(&env, "mixed", 180);
    let slow = times_of(&peer, |a| a.ends_with("@slow.test"));
    let fast = times_of(&peer, |a| a.ends_with("@fast.test"));
    assert_eq!((slow.len(), fast.len()), (n_slow, n_fast), "{}", logs(&env));
    assert_eq!(peer.duplicates(), 0);
    let before: Vec<Instant> = slow.iter().copied().filter(|&t| t < raised).collect();
    let slow_peak_before = max_in_window(&before, Duration::from_secs(1));
    let slow_peak = max_in_window(&slow, Duration::from_secs(1));
    let fast_peak = max_in_window(&fast, Duration::from_secs(1));
    let slow_rate =
        count_between(&slow, Duration::from_secs(1), Duration::from_secs(6)) as f64 / 6.0;
    let per_second = |times: &[Instant], from: Instant, secs: u64| -> Vec<usize> {
        (0..secs)
            .map(|k| {
                let s = from + Duration::from_secs(k);
                times
                    .iter()
                    .filter(|&&t| t >= s && t < s + Duration::from_secs(1))
                    .count()
            })
            .collect()
    };
    // fast.test in each of the 10 s after the first second (which holds
    // the burst; it needs about 13 s in all). Coupled to slow.test, every
    // one of them holds about 40. A loaded machine stalls now and then for
    // most of a second (CI has shown one second at 33, and two at 86 and
    // 90): the median says what the design does, the mean bounds the rest.
    let mut fast_seconds = per_second(&fast, fast[0] + Duration::from_secs(1), 10);
    let fast_rate = fast_seconds.iter().sum::<usize>() as f64 / 10.0;
    fast_seconds.sort_unstable();
    let fast_median = (fast_seconds[4] + fast_seconds[5]) as f64 / 2.0;
    let after = per_second(&slow, raised, 8);
    eprintln!(
        "slow.test 20/s: {slow_rate:.1}/s, peak {slow_peak_before} in 1 s; fast.test 150/s: {fast_rate:.1}/s (median second {fast_median}), peak {fast_peak} in 1 s"
    );
    eprintln!(
        "fast.test per second from the first message: {:?}",
        per_second(&fast, first, 14)
    );
    eprintln!(
        "slow.test per second from the first message: {:?}",
        per_second(&slow, first, 10)
    );
    eprintln!("slow.test per second after `rate set` to 60/s: {after:?}");
    eprintln!("status mid-run:\n{status}");
    assert!(
        slow_peak_before <= 22,
        "slow.test held {slow_peak_before} in a 1 s window, over 20/s + burst 2"
    );
    assert!(
        slow_peak <= 66,
        "slow.test held {slow_peak} in 1 s, over 60/s + burst 6"
    );
    assert!(
        fast_peak <= 165,
        "fast.test held {fast_peak} in 1 s, over 150/s + 15"
    );
    assert!(
        fast_median >= 0.85 * 150.0 && fast_rate >= 0.75 * 150.0,
        "fast.test only {fast_median}/s in its median second ({fast_rate:.1}/s on average) while slow.test was at {slow_rate:.1}/s: held back by slow.test\n{}",
        logs(&env)
    );
    assert!(slow_rate >= 0.75 * 20.0, "slow.test only {slow_rate:.1}/s");
    // Within 3 s of the command, a second at (nearly) the new rate.
    let best_early = after[..3].iter().max().copied().unwrap_or(0);
    assert!(
        best_early >= 45,
        "slow.test did not reach its new rate of 60/s within 3 s: {after:?}"
    );
    // Status showed the groups with what waits for them.
    assert!(status.contains("domain:slow.test"), "{status}");
    assert!(status.contains("parked"), "{status}");
}

/// A domain allowed two messages a minute inside a 5,000-recipient
/// campaign. (Issue 16 says one a minute; two a minute keeps the test near
/// a minute and a half, and the mechanism is the same: the next token is 30 s
/// off, fifteen times the 2 s a message may be parked and the job's whole
/// TTR, so only deferral into a delayed job keeps the jobs moving.) Every
/// other recipient goes out at full speed, before the slow domain's second
/// message; the slow ones go out about 30 s apart from delayed jobs; no job
/// outlives its TTR reserved; everyone is sent exactly once.
#[test]
fn a_domain_at_two_a_minute_goes_out_from_delayed_jobs() {
    // Not alone: its gaps are 30 s and its bound on the others (all out
    // before slow.test's second token) leaves 25 s for 1,000 messages, so
    // the machine's load cannot move it; it runs beside the rest, whose
    // minute it would otherwise hold.
    let n = 1_000;
    // Three slow recipients, in three different jobs.
    const SLOW_AT: [usize; 3] = [10, 510, 990];
    let Rig {
        env,
        peer,
        bs,
        _tmp,
    } = enqueued(
        "big",
        n,
        |i| {
            if SLOW_AT.contains(&i) {
                "slow.test"
            } else {
                "example.test"
            }
        },
        &[("domain:slow.test", "2/m", "1")],
    );
    let put_by_enqueue = bs.tube_stat(&env.tube, "total-jobs");
    let _w: Vec<Proc> = (0..2)
        .map(|i| logged_worker(&env, &format!("w{i}"), &["--concurrency", "50"]))
        .collect();
    // Sampled while the slow ones wait: jobs delayed, none reserved.
    let mut idle_with_delayed = 0;
    wait_for(150, "the campaign to finish", || {
        let others_done = peer.log.lock().unwrap().len() >= n - 2;
        if others_done
            && bs.tube_stat(&env.tube, "current-jobs-delayed") > 0
            && bs.tube_stat(&env.tube, "current-jobs-reserved") == 0
        {
            idle_with_delayed += 1;
        }
        env.status("big")["pending"] == 0
    });
    let slow = times_of(&peer, |a| a.ends_with("@slow.test"));
    let others = times_of(&peer, |a| a.ends_with("@example.test"));
    assert_eq!((slow.len(), others.len()), (3, n - 3), "{}", logs(&env));
    assert_eq!(peer.duplicates(), 0);
    let gaps: Vec<f64> = slow
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    let others_took = (others[others.len() - 1] - others[0]).as_secs_f64();
    let deferral_jobs = bs.tube_stat(&env.tube, "total-jobs") - put_by_enqueue;
    let mut stats = bs.client().stats().unwrap();
    let timeouts: u64 = stats
        .remove("job-timeouts")
        .and_then(|v| v.parse().ok())
        .unwrap();
    eprintln!(
        "others: {} in {others_took:.1} s; slow.test gaps {gaps:?} s; {deferral_jobs} jobs put by deferral; job-timeouts {timeouts}; {idle_with_delayed} samples with only delayed jobs",
        others.len()
    );
    assert!(
        others[others.len() - 1] < slow[1],
        "the other recipients were not all delivered before slow.test's second token: {others_took:.1} s"
    );
    for g in &gaps {
        assert!(
            *g >= 27.0 && *g <= 60.0,
            "slow.test messages {gaps:?} s apart, not about 30 s"
        );
    }
    assert!(
        deferral_jobs >= 2,
        "slow recipients did not go into new jobs"
    );
    assert_eq!(timeouts, 0, "a job stayed reserved past its TTR");
    assert!(
        idle_with_delayed > 0,
        "while slow.test waited, jobs were held reserved instead of delayed"
    );
    let status = env.status("big");
    assert_eq!(status["sent"], n as i64);
    assert_eq!(status["pending"], 0);
}

/// Every job holds 99 recipients at fast.test (50/s) and one at slow.test
/// (one an hour). A worker with `--concurrency 20` holds three jobs, about
/// 300 fast.test recipients or 6 s of its rate, of which 2 s may be parked:
/// the rest is deferred for a second or two, and each job's slow.test
/// recipient (after the first) for an hour. The fast ones must come back in
/// seconds. Deferred into one new job per finished job, delayed for the
/// longest of its recipients' delays, they would wait out the hour with the
/// slow one; they go into a job per rate group.
#[test]
fn a_fast_domains_deferred_recipients_do_not_wait_for_a_slow_ones() {
    let _alone = crate::util::alone();
    let n = 1_000;
    let Rig {
        env,
        peer,
        bs: _bs,
        _tmp,
    } = enqueued(
        "mixed",
        n,
        |i| {
            if i % 100 == 50 {
                "slow.test"
            } else {
                "fast.test"
            }
        },
        &[
            ("domain:slow.test", "1/h", "1"),
            ("domain:fast.test", "50/s", "5"),
        ],
    );
    let _w = logged_worker(&env, "w0", &["--concurrency", "20"]);
    let n_fast = n - n / 100;
    let fast_sent = || times_of(&peer, |a| a.ends_with("@fast.test"));
    // 990 at 50/s take 20 s.
    wait_for(90, "every fast.test recipient", || {
        fast_sent().len() >= n_fast
    });
    let fast = fast_sent();
    let slow = times_of(&peer, |a| a.ends_with("@slow.test"));
    let took = (fast[fast.len() - 1] - fast[0]).as_secs_f64();
    let log = std::fs::read_to_string(env.dir.path().join("w0.log")).unwrap();
    let split = log.matches("put in 2 new job(s)").count();
    eprintln!(
        "fast.test: {} in {took:.1} s; slow.test: {}; {split} jobs deferred into a job per group",
        fast.len(),
        slow.len()
    );
    assert_eq!(fast.len(), n_fast);
    assert_eq!(peer.duplicates(), 0);
    // The first slow.test recipient took the burst; the next is an hour off.
    assert_eq!(slow.len(), 1, "{}", logs(&env));
    assert!(
        split > 0,
        "no job deferred recipients of both groups, so this run shows nothing:\n{}",
        logs(&env)
    );
    assert!(
        took < 40.0,
        "fast.test took {took:.1} s for 20 s of its rate"
    );
}

/// kill -9 of a worker while it holds parked messages and has deferred
/// recipients: nobody lost (everyone delivered, the ledger complete), and
/// at most `--concurrency` recipients sent twice.
#[test]
fn kill_9_with_parked_and_deferred_recipients() {
    use mailsplit::store::{rates, workers};
    let n = 1_200;
    let Rig {
        env,
        peer,
        bs: _bs,
        _tmp,
    } = enqueued(
        "k",
        n,
        |i| if i % 3 == 0 { "slow.test" } else { "fast.test" },
        &[("domain:slow.test", "15/s", "2")],
    );
    let mut victim = logged_worker(&env, "victim", &["--concurrency", "10"]);
    let _other = logged_worker(&env, "other", &["--concurrency", "10"]);
    let pid = i64::from(victim.0.id());
    let mut seen = None;
    wait_for(
        60,
        "the victim to hold parked and deferred recipients",
        || {
            let mut c = env.conn();
            let Some(row) = workers::list(&mut c)
                .unwrap()
                .into_iter()
                .find(|w| w.pid == pid)
            else {
                return false;
            };
            let usage = rates::usage_of(&mut c, &row.id).unwrap();
            let slow = usage.into_iter().find(|u| u.name == "domain:slow.test");
            let hit = slow
                .as_ref()
                .is_some_and(|u| u.parked > 0 && u.deferred > 0);
            if hit {
                seen = slow;
            }
            hit
        },
    );
    victim.0.kill().unwrap();
    victim.0.wait().unwrap();
    let _replacement = logged_worker(&env, "replacement", &["--concurrency", "10"]);
    wait_done(&env, "k", 150);
    let received = peer.received.lock().unwrap().clone();
    let missing = (0..n)
        .filter(|i| {
            let domain = if i % 3 == 0 { "slow.test" } else { "fast.test" };
            !received.contains_key(&format!("user{i}@{domain}"))
        })
        .count();
    let extra: u32 = received.values().map(|&c| c.saturating_sub(1)).sum();
    eprintln!("victim's slow.test usage when killed: {seen:?}; lost {missing}, sent twice {extra}");
    assert_eq!(missing, 0, "recipients lost\n{}", logs(&env));
    assert!(extra <= 10, "{extra} sent twice, more than --concurrency");
    let status = env.status("k");
    assert_eq!(status["sent"], n as i64);
}

/// A `campaign:` group set just before `enqueue`, with the workers already
/// running (and their groups read moments before): the campaign's very
/// first messages keep to it. A worker reads the groups again when it meets
/// a campaign it has not seen.
#[test]
fn a_campaign_group_set_just_before_enqueue_holds_from_the_first_message() {
    let _alone = crate::util::alone();
    let Rig {
        env,
        peer,
        bs: _bs,
        _tmp,
    } = rig(Kind::Sqlite);
    env.import_n("news", 300);
    env.create_campaign("news", "news", &[]);
    let _w: Vec<Proc> = (0..2)
        .map(|i| logged_worker(&env, &format!("w{i}"), &["--concurrency", "20"]))
        .collect();
    wait_for(30, "the workers to start", || env.workers().len() == 2);
    std::thread::sleep(Duration::from_millis(700));
    env.ok(&["rate", "set", "campaign:news", "40/s", "--burst", "4"]);
    env.ok(&["enqueue", "news"]);
    wait_done(&env, "news", 60);
    let times = times_of(&peer, |_| true);
    assert_eq!(times.len(), 300);
    let first = count_between(&times, Duration::ZERO, Duration::from_secs(1));
    let peak = max_in_window(&times, Duration::from_secs(1));
    eprintln!("campaign group 40/s set just before enqueue: first second {first}, peak {peak}");
    assert!(
        first <= 44,
        "{first} messages in the first second, over 40/s + 4"
    );
    assert!(peak <= 44, "{peak} messages in a 1 s window, over 40/s + 4");
}

#[test]
fn rate_commands_validate_their_input() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(Kind::Sqlite, &bs.addr());
    env.ok(&["migrate"]);
    let bad_group = env.run(&["rate", "set", "gmail.com", "10/s"]);
    assert_eq!(bad_group.status.code(), Some(2), "{}", stderr(&bad_group));
    assert!(stderr(&bad_group).contains("domain:"));
    let bad_rate = env.run(&["rate", "set", "domain:gmail.com", "fast"]);
    assert_eq!(bad_rate.status.code(), Some(2));
    assert!(stderr(&bad_rate).contains("N/s"));
    // A relay group without its port would never match a worker's relay.
    for bad in [
        "relay:127.0.0.1",
        "relay:mx.example.test:",
        "relay::25",
        "relay:h:99999",
    ] {
        let out = env.run(&["rate", "set", bad, "10/s"]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("relay:HOST:PORT"),
            "{bad}: {}",
            stderr(&out)
        );
    }
    env.ok(&["rate", "set", "relay:127.0.0.1:25", "10/s"]);
    // A campaign group must name a campaign (by its name).
    let out = env.run(&["rate", "set", "campaign:nope", "10/s"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no campaign \"nope\""),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("campaign:NAME"), "{}", stderr(&out));
    env.import_n("news", 3);
    env.create_campaign("news", "news", &[]);
    env.ok(&["rate", "set", "campaign:news", "10/s"]);
    // Domains are stored lowercased: one group whatever the case typed.
    env.ok(&["rate", "set", "domain:GMail.com", "600/m"]);
    env.ok(&["rate", "set", "domain:gmail.COM", "300/m"]);
    let list = env.ok(&["rate", "list"]);
    assert_eq!(list.matches("domain:").count(), 1, "{list}");
    assert!(list.contains("domain:gmail.com"), "{list}");
    assert!(list.contains("limit         5/s"), "{list}");
    assert!(
        list.contains("campaign:news") && list.contains("relay:127.0.0.1:25"),
        "{list}"
    );
    env.ok(&["rate", "delete", "domain:Gmail.Com"]);
    assert_eq!(
        env.run(&["rate", "delete", "domain:gmail.com"])
            .status
            .code(),
        Some(2)
    );
}

/// A throttling reply seen by one worker halves the group's shared rate
/// for every worker, once per interval however many workers saw it at
/// once; clean replies bring it back step by step. In-process limiters
/// (two workers) against the real database.
fn a_throttle_halves_the_shared_rate_for_every_worker_and_it_recovers(kind: Kind) {
    let _alone = crate::util::alone();
    use mailsplit::rate::limiter::Limiter;
    use mailsplit::store::{rates, Conn};
    use mailsplit::store::{Db, Plans};

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = TestDb::new(kind);
        let mut conn = Conn::open(&db.url).unwrap();
        conn.migrate().unwrap();
        rates::set(&mut conn, "relay:127.0.0.1:25", 400.0, 1).unwrap();
        let worker = || {
            let c = Conn::open(&db.url).unwrap();
            Limiter::new(
                Db::new(&db.url, Some(c), Plans::Custom),
                "127.0.0.1:25",
                None,
            )
        };
        let (a, b) = (worker(), worker());
        a.refresh().await.unwrap();
        b.refresh().await.unwrap();
        let groups = a.groups_for("news", "example.test");
        assert_eq!(groups, vec!["relay:127.0.0.1:25".to_string()]);
        let factor = |conn: &mut Conn| rates::list(conn).unwrap()[0].factor;

        let timed = |l: &'static Limiter, n: usize| {
            let groups = groups.clone();
            async move {
                let t = Instant::now();
                for _ in 0..n {
                    l.acquire(&groups, 1, Duration::from_secs(5)).await.unwrap();
                }
                t.elapsed()
            }
        };
        let (a, b): (&'static Limiter, &'static Limiter) =
            (Box::leak(Box::new(a)), Box::leak(Box::new(b)));
        let full = timed(b, 80).await;
        // Worker a is throttled three times at once: one cut.
        for _ in 0..3 {
            a.slow_down(&groups, "454 Throttling failure").await;
        }
        assert_eq!(factor(&mut conn), 0.5);
        let half = timed(b, 80).await;
        eprintln!(
            "80 tokens at 400/s on the other worker: {full:?}, then {half:?} after the throttle"
        );
        // why the nominal time too: a loaded machine stretches the first
        // run past 80 tokens at 400/s (200 ms), and that stretch is no
        // part of the second run's rate
        let nominal = Duration::from_millis(200);
        assert!(
            half > full.min(nominal) * 3 / 2,
            "the other worker did not slow: {full:?} vs {half:?}"
        );
        let list = rates::list(&mut conn).unwrap();
        assert_eq!(
            list[0].adapted_reason.as_deref(),
            Some("454 Throttling failure")
        );

        // A throttle after the interval cuts again.
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        b.slow_down(&groups, "421 4.7.28 unusual rate").await;
        assert_eq!(factor(&mut conn), 0.25);

        // Clean replies, on either worker, step it back up to the full rate.
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(1_010)).await;
            a.success(&groups).await;
            b.success(&groups).await;
            if factor(&mut conn) >= 1.0 {
                break;
            }
        }
        assert_eq!(factor(&mut conn), 1.0, "no recovery");
    });
}

/// A rate or burst written into the table by hand, out of what `rate set`
/// accepts, is listed as not in force, with what the limiter uses instead;
/// and the limiter does pace such a group as the listing says.
fn out_of_range_stored_values_are_listed_as_not_in_force(kind: Kind) {
    use mailsplit::store::rates::{self, Lease};

    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.ok(&["migrate"]);
    env.ok(&["rate", "set", "domain:zero.test", "100/s", "--burst", "5"]);
    env.ok(&["rate", "set", "domain:slowest.test", "1/d", "--burst", "1"]);
    env.ok(&["rate", "set", "domain:fine.test", "100/s", "--burst", "5"]);
    env.sql("UPDATE rate_groups SET rate = 0, burst = 0 WHERE name = 'domain:zero.test'");
    let list = env.ok(&["rate", "list"]);
    let line = |group: &str| {
        list.lines()
            .find(|l| l.starts_with(group))
            .unwrap_or_else(|| panic!("no {group} in {list}"))
            .to_string()
    };
    let zero = line("domain:zero.test");
    assert!(
        zero.contains("limit invalid: 0/s (stored), not in force; limiter uses 1/d"),
        "{zero}"
    );
    assert!(
        zero.contains("burst invalid: 0 (stored), not in force; limiter uses 1"),
        "{zero}"
    );
    let fine = line("domain:fine.test");
    assert!(fine.contains("limit       100/s  burst     5"), "{fine}");
    assert!(!fine.contains("invalid"), "{fine}");
    // What the listing says is what a lease does: paced as 1/d, burst 1.
    let mut conn = env.conn();
    let interval =
        |conn: &mut mailsplit::store::Conn, group: &str| match rates::lease(conn, group, 1, 0, 0)
            .unwrap()
        {
            Lease::Granted { interval_us, .. } => interval_us,
            other => panic!("{group}: {other:?}"),
        };
    assert_eq!(
        interval(&mut conn, "domain:zero.test"),
        interval(&mut conn, "domain:slowest.test")
    );
}

both!(
    a_throttle_halves_the_shared_rate_for_every_worker_and_it_recovers,
    out_of_range_stored_values_are_listed_as_not_in_force,
    three_workers_hold_a_relay_limit,
);
