//! A relay that throttles at MAIL FROM (Amazon SES's quota, sequenced as
//! Postfix sequences a pipelined transaction whose MAIL was refused: 454 to
//! the MAIL, 503 "need MAIL command" to its RCPT and DATA). The throttle
//! defers, never fails; the workers share the adapted rate and settle near
//! the relay's quota, whatever rate was configured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;

/// A pipelining peer with a MAIL quota of `per_second`, its environment
/// on `kind`, the relay's group set far above the quota.
fn quota_rig(
    kind: Kind,
    per_second: usize,
    configured: &str,
) -> (
    tempfile::TempDir,
    Beanstalkd,
    ScriptedSmtp,
    Env,
    Arc<MailQuota>,
) {
    let quota = Arc::new(MailQuota::new(per_second));
    let (tmp, bs, peer, env) = setup(
        kind,
        Script {
            pipelining: true,
            mail_quota: Some(quota.clone()),
            ..Script::default()
        },
    );
    env.ok(&["migrate"]);
    let group = format!("relay:127.0.0.1:{}", peer.port);
    env.ok(&["rate", "set", &group, configured, "--burst", "10"]);
    (tmp, bs, peer, env, quota)
}

/// Every recipient of the list accepted exactly once, and the ledger says
/// sent for all, failed for none.
fn all_sent_once(env: &Env, peer: &ScriptedSmtp, name: &str, n: usize) {
    let s = env.status(name);
    assert_eq!(
        (s["sent"].as_i64(), s["failed"].as_i64()),
        (Some(n as i64), Some(0)),
        "{s}"
    );
    assert_ne!(s["state"], "paused", "{s}");
    assert_eq!(peer.total() as usize, n);
    assert_eq!(peer.duplicates(), 0);
    for i in (1..=n).step_by(97) {
        assert_eq!(peer.count(&format!("user{i}@example.test")), 1, "user{i}");
    }
}

/// The scenario on one worker: throttled MAILs with 503s behind
/// them fail nobody, count toward no `--max-failure-rate` (set tight
/// here: 1 %), and `rate list` shows the cut with the relay's reply.
fn a_throttled_mail_defers_its_recipients_and_fails_none(kind: Kind) {
    let (_tmp, _bs, peer, env, quota) = quota_rig(kind, 40, "2000/s");
    env.import_n("news", 300);
    env.create_campaign("news", "news", &["--max-failure-rate", "1%"]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&["--concurrency", "20"]);
    wait_done(&env, "news", 120);
    all_sent_once(&env, &peer, "news", 300);
    let (attempts, throttled) = quota.attempts_since(Instant::now() - Duration::from_secs(3600));
    assert!(
        throttled > 0,
        "the relay never throttled ({attempts} MAILs): the test tests nothing"
    );
    let list = env.ok(&["rate", "list"]);
    assert!(list.contains("Throttling failure"), "{list}");
}

/// Accepted messages and MAIL attempts per second from `from`, for a
/// failing assertion.
fn per_second(times: &[Instant], from: Instant, secs: u64) -> Vec<usize> {
    (0..secs)
        .map(|k| {
            let s = from + Duration::from_secs(k);
            let e = s + Duration::from_secs(1);
            times.iter().filter(|&&t| t >= s && t < e).count()
        })
        .collect()
}

/// Issue 40's done-when, scaled to this machine: a relay whose quota is
/// `QUOTA`/s, the relay's group configured twenty times higher, three
/// workers sharing the adapted rate. Nothing fails, every recipient once;
/// in the second half of the send under 10 % of the MAILs are throttled
/// and the relay accepts at least 0.7 of its quota. A rate that only one
/// worker adapted (or that swings between half and over the quota) shows
/// here as many throttles or a low rate.
fn three_workers_settle_near_a_relays_quota(kind: Kind) {
    let _alone = crate::util::alone();
    const QUOTA: usize = 100;
    const N: usize = 2_400;
    let (_tmp, _bs, peer, env, quota) = quota_rig(kind, QUOTA, "2000/s");
    env.import_n("news", N);
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let start = Instant::now();
    let _w: Vec<Proc> = (0..3)
        .map(|_| env.worker(&["--concurrency", "20"]))
        .collect();
    wait_done(&env, "news", 180);
    all_sent_once(&env, &peer, "news", N);
    let mut accepted: Vec<Instant> = peer.log.lock().unwrap().iter().map(|(t, _)| *t).collect();
    accepted.sort();
    // The send's second half, up to the 98th percentile of accepts: the
    // last 2 % are stragglers, recipients deferred by a throttle that come
    // back from delayed jobs after the rest is out (a tail of a second or
    // two with nothing else left to send says nothing about the rate the
    // workers keep). The whole send is bounded below as well.
    let (first, last) = (accepted[0], accepted[N * 98 / 100]);
    let half = first + (last - first) / 2;
    let (attempts, throttled) = quota.attempts_since(half);
    let second_half = accepted.iter().filter(|&&t| t >= half && t <= last).count();
    let rate = second_half as f64 / (last - half).as_secs_f64();
    let whole = (accepted[N - 1] - first).as_secs_f64();
    assert!(
        whole < 1.6 * N as f64 / QUOTA as f64,
        "the send took {whole:.1} s for {N} at a quota of {QUOTA}/s"
    );
    let share = throttled as f64 / attempts as f64;
    let throttles: Vec<Instant> = quota
        .attempts
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, th)| *th)
        .map(|(t, _)| *t)
        .collect();
    let secs = (last - first).as_secs() + 1;
    eprintln!(
        "quota {QUOTA}/s, 3 workers: {:.1} s from start to first accept; second half {rate:.1}/s, {throttled} of {attempts} MAILs throttled ({:.1} %)\naccepted per second: {:?}\nthrottled per second: {:?}\n{}",
        (first - start).as_secs_f64(),
        share * 100.0,
        per_second(&accepted, first, secs),
        per_second(&throttles, first, secs),
        env.ok(&["rate", "list"]),
    );
    assert!(
        share < 0.10,
        "{throttled} of {attempts} MAILs throttled in the second half"
    );
    assert!(
        rate >= 0.7 * QUOTA as f64,
        "second half at {rate:.1}/s, under 0.7 of the quota {QUOTA}/s"
    );
}

both!(
    a_throttled_mail_defers_its_recipients_and_fails_none,
    three_workers_settle_near_a_relays_quota,
);

/// Issue 40 item 7: a fast domain (300/s) beside a slow one (50/s), a
/// fresh worker. A group with tokens to spare is served at its rate from
/// its first message: the fast domain's first second after its first
/// message holds nearly its rate, as its later seconds do (the limiter
/// paces at 95 % of the rate). A worker that ramps up (sessions opened a
/// few at a time, tokens leased late or dropped) shows a first second
/// well under the later ones.
/// Before the fix the first second held 123, then 155, 258, 261 on the
/// loaded 2-core machine: a lease's burst tokens were spaced out from the
/// lease instead of usable at once, and sessions opened one per 20 ms.
#[test]
fn a_fresh_worker_serves_a_fast_domain_at_its_rate_from_the_first_message() {
    let _alone = crate::util::alone();
    let (_tmp, _bs, peer, env) = setup(Kind::Sqlite, Script::default());
    env.ok(&["migrate"]);
    let n = 1_400;
    let csv = env.dir.path().join("mixed.csv");
    let mut rows = String::from("email,name\n");
    for i in 0..n {
        let domain = if i % 7 == 0 { "slow.test" } else { "fast.test" };
        rows.push_str(&format!("user{i}@{domain},User {i}\n"));
    }
    std::fs::write(&csv, rows).unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "mixed"]);
    env.ok(&["rate", "set", "domain:slow.test", "50/s", "--burst", "5"]);
    env.ok(&["rate", "set", "domain:fast.test", "300/s", "--burst", "30"]);
    env.create_campaign("mixed", "mixed", &[]);
    env.ok(&["enqueue", "mixed"]);
    let _w = env.worker(&["--concurrency", "20"]);
    wait_done(&env, "mixed", 120);
    let mut fast: Vec<Instant> = peer
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, a)| a.ends_with("@fast.test"))
        .map(|(t, _)| *t)
        .collect();
    fast.sort();
    assert_eq!(fast.len(), n - n / 7);
    let first = fast[0];
    let tenths: Vec<usize> = (0..20)
        .map(|k| {
            let s = first + Duration::from_millis(100 * k);
            let e = s + Duration::from_millis(100);
            fast.iter().filter(|&&t| t >= s && t < e).count()
        })
        .collect();
    let seconds = per_second(&fast, first, 5);
    eprintln!("fast.test per 100 ms from its first message: {tenths:?}\nper second: {seconds:?}");
    // 300/s paced at 95 % is 285/s; the burst adds up to 30 once.
    assert!(
        seconds[0] >= 240,
        "fast.test's first second held {}, its next ones {:?}: a slow start",
        seconds[0],
        &seconds[1..]
    );
    // The burst is spent once, not per lease: no second holds more than
    // the paced rate and the burst.
    assert!(
        seconds.iter().all(|&s| s <= 285 + 30 + 10),
        "fast.test over its rate and burst: {seconds:?}"
    );
}
