//! Shared rate limits across worker processes, checked at the SMTP peer:
//! no one-second window over rate + burst, and the limit is used (≥ 90 %).

mod common;

use std::time::{Duration, Instant};

use common::*;

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
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
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
        .map(|_| env.worker(&["--concurrency", "50"]))
        .collect();
    wait_for(120, "the campaign to finish", || {
        env.status("news")["pending"] == 0
    });
    let wall = started.elapsed();
    let times = times_of(&peer, |_| true);
    assert_eq!(times.len(), 2_600);
    assert_eq!(peer.duplicates(), 0);
    let peak = max_in_window(&times, Duration::from_secs(1));
    let steady = count_between(&times, Duration::from_secs(1), Duration::from_secs(10));
    eprintln!(
        "relay limit 200/s burst 20, 3 workers: peak 1 s window {peak}, 10 s average {:.1}/s",
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
    assert!(
        peak <= 220,
        "a 1 s window held {peak} messages, over rate + burst"
    );
    assert!(
        steady >= 1_800,
        "only {steady} messages in 10 s: the limit is not used"
    );
    let list = env.ok(&["rate", "list"]);
    assert!(list.contains("limit     200.0/s"), "{list}");
}

#[test]
fn three_workers_hold_a_relay_limit_sqlite() {
    three_workers_hold_a_relay_limit(Kind::Sqlite);
}

#[test]
fn three_workers_hold_a_relay_limit_postgres() {
    three_workers_hold_a_relay_limit(Kind::Postgres);
}

#[test]
fn two_domains_with_different_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    let csv = env.dir.path().join("mixed.csv");
    let mut rows = String::from("email,name\n");
    for i in 0..1_400 {
        // 400 at slow.test (40/s, 10 s), 1,000 at fast.test (100/s, 10 s),
        // interleaved so every job holds both.
        let domain = if i % 7 < 2 { "slow.test" } else { "fast.test" };
        rows.push_str(&format!("user{i}@{domain},User {i}\n"));
    }
    std::fs::write(&csv, rows).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", csv.to_str().unwrap(), "--list", "mixed"]);
    env.ok(&["rate", "set", "domain:slow.test", "40/s", "--burst", "4"]);
    env.ok(&["rate", "set", "domain:fast.test", "6000/m", "--burst", "10"]);
    env.create_campaign("mixed", "mixed", &[]);
    env.ok(&["enqueue", "mixed"]);
    let _w: Vec<Proc> = (0..2)
        .map(|_| env.worker(&["--concurrency", "40"]))
        .collect();
    wait_for(120, "the campaign to finish", || {
        env.status("mixed")["pending"] == 0
    });
    let slow = times_of(&peer, |a| a.ends_with("@slow.test"));
    let fast = times_of(&peer, |a| a.ends_with("@fast.test"));
    assert_eq!((slow.len(), fast.len()), (400, 1_000));
    let (slow_peak, fast_peak) = (
        max_in_window(&slow, Duration::from_secs(1)),
        max_in_window(&fast, Duration::from_secs(1)),
    );
    let slow_rate =
        count_between(&slow, Duration::from_secs(1), Duration::from_secs(5)) as f64 / 5.0;
    let fast_rate =
        count_between(&fast, Duration::from_secs(1), Duration::from_secs(5)) as f64 / 5.0;
    eprintln!("slow.test: peak {slow_peak}/s, {slow_rate:.1}/s; fast.test: peak {fast_peak}/s, {fast_rate:.1}/s");
    assert!(slow_peak <= 44, "slow.test peaked at {slow_peak} in 1 s");
    assert!(fast_peak <= 110, "fast.test peaked at {fast_peak} in 1 s");
    assert!(slow_rate >= 36.0, "slow.test only {slow_rate}/s");
    assert!(
        fast_rate >= 90.0,
        "fast.test only {fast_rate}/s: held back by slow.test"
    );
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
    env.ok(&["rate", "set", "domain:gmail.com", "600/m"]);
    assert!(env.ok(&["rate", "list"]).contains("domain:gmail.com"));
    env.ok(&["rate", "delete", "domain:gmail.com"]);
    assert_eq!(
        env.run(&["rate", "delete", "domain:gmail.com"])
            .status
            .code(),
        Some(2)
    );
}

/// A "slow down" reply halves this worker's share of the group's rate; it
/// grows back after quiet seconds. Timed in-process against a real SQLite
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_down_halves_the_local_rate_and_recovers() {
    use mailsplit::ratelimit::Limiter;
    use mailsplit::store::Db;
    use mailsplit::store::{rates, Conn};

    let db = TestDb::new(Kind::Sqlite);
    let mut conn = Conn::open(&db.url).unwrap();
    conn.migrate().unwrap();
    rates::set(&mut conn, "relay:127.0.0.1:25", 400.0, 1).unwrap();
    let limiter = Limiter::new(Db::new(&db.url, Some(conn)), "127.0.0.1:25");
    limiter.refresh().await.unwrap();
    let groups = limiter.groups_for("news", "example.test");
    assert_eq!(groups, vec!["relay:127.0.0.1:25".to_string()]);

    let timed = |n: usize| {
        let (limiter, groups) = (&limiter, &groups);
        async move {
            let t = Instant::now();
            for _ in 0..n {
                limiter
                    .acquire(groups, 1, Duration::from_secs(5))
                    .await
                    .unwrap();
            }
            t.elapsed()
        }
    };
    let full = timed(80).await;
    limiter.slow_down(&groups).await;
    limiter.slow_down(&groups).await;
    let quarter = timed(80).await;
    eprintln!("80 tokens at 400/s: {full:?} at full rate, {quarter:?} after two slow-downs");
    assert!(
        full < Duration::from_millis(400),
        "full rate too slow: {full:?}"
    );
    assert!(
        quarter > full * 3,
        "slow-down did not slow: {full:?} vs {quarter:?}"
    );

    // Quiet seconds with successes bring the rate back step by step.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        limiter.success(&groups).await;
    }
    let recovered = timed(80).await;
    assert!(
        recovered < quarter / 2,
        "no recovery: {recovered:?} vs {quarter:?}"
    );
}
