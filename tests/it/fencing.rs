//! Fencing: a claim's token is its fence in the ledger, so
//! a stale worker's late outcome never overwrites the outcome of the
//! worker that took its recipients over; and a worker cut from its
//! database (packets dropped, no refusal) stops sending the job whose
//! claims it cannot extend, so what it sends after the cut is bounded by
//! what it had in flight, not by how long the cut lasts. The cut tests
//! run their processes with a claim lease of [`LEASE`] through
//! `MAILSPLIT_LEASE_MS` (production: 30 s): the bound they check is in
//! leases, so a shorter one proves the same thing sooner.

use std::time::{Duration, Instant};

use mailsplit::store::deliveries::{
    self, ledger_counts, DeliveryState, Outcome, OutcomeKind, Recorded,
};
use mailsplit::store::{Db, Plans, StoreError};

use crate::util::*;

/// The claim lease (and job TTR) of the cut tests' processes.
const LEASE: Duration = Duration::from_secs(10);

/// A world whose processes hold claims for [`LEASE`].
fn short_lease_world() -> World {
    World::new(Kind::Postgres).var("MAILSPLIT_LEASE_MS", &LEASE.as_millis().to_string())
}

/// `status --json` equals `COUNT(*)` of the ledger, with nothing pending.
fn assert_exact(env: &Env, name: &str, recipients: i64) {
    let s = env.status(name);
    let id = s["id"].as_i64().unwrap();
    let ledger = ledger_counts(&mut env.conn(), id).unwrap();
    let count = |state| ledger.get(&state).copied().unwrap_or(0);
    assert_eq!(s["pending"].as_i64(), Some(0), "{s}");
    assert_eq!(s["sent"].as_i64(), Some(count(DeliveryState::Sent)), "{s}");
    assert_eq!(
        s["failed"].as_i64(),
        Some(count(DeliveryState::Failed)),
        "{s}"
    );
    assert_eq!(
        s["skipped"].as_i64(),
        Some(count(DeliveryState::Skipped)),
        "{s}"
    );
    assert_eq!(ledger.values().sum::<i64>(), recipients, "{ledger:?}");
}

fn outcome(campaign_id: i64, recipient_id: i64, token: i64, kind: OutcomeKind) -> Outcome {
    Outcome {
        campaign_id,
        recipient_id,
        token,
        kind,
        content_version: None,
    }
}

/// Worker A's claim lapses, worker B takes the recipients over and records
/// its outcomes; A's late outcomes, whatever they say, change nothing, and
/// A can no longer extend what B holds.
fn a_stale_claims_late_outcome_does_not_overwrite(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    env.campaign_without_enqueue("news", 4);
    let campaign = env.status("news")["id"].as_i64().unwrap();
    let ids = member_ids(&env, "news");
    let mut c = env.conn();
    let (a, b) = (11, 22);
    assert_eq!(
        deliveries::claim(&mut c, campaign, &ids, a, 1)
            .unwrap()
            .owned
            .len(),
        4
    );
    std::thread::sleep(Duration::from_millis(20));
    let taken = deliveries::claim(&mut c, campaign, &ids, b, 30_000).unwrap();
    assert_eq!(taken.owned.len(), 4, "B takes over the lapsed claims");
    assert_eq!(
        deliveries::extend_claims(&mut c, campaign, a, 30_000).unwrap(),
        0
    );
    let b_says = [
        OutcomeKind::Sent,
        OutcomeKind::Failed("550 no".into()),
        OutcomeKind::Retry("451 later".into()),
        OutcomeKind::Sent,
    ];
    let recorded: Vec<Recorded> = deliveries::record(
        &mut c,
        &ids.iter()
            .zip(b_says)
            .map(|(&rid, k)| outcome(campaign, rid, b, k))
            .collect::<Vec<_>>(),
        5,
    )
    .unwrap();
    assert!(!recorded.contains(&Recorded::Lost), "{recorded:?}");
    let before = ledger_counts(&mut c, campaign).unwrap();
    // A's late outcomes: every kind, once all-successes (PostgreSQL's fast
    // path) and once mixed.
    let sent_only: Vec<Outcome> = ids
        .iter()
        .map(|&rid| outcome(campaign, rid, a, OutcomeKind::Sent))
        .collect();
    let mixed = [
        OutcomeKind::Failed("550 stale".into()),
        OutcomeKind::Sent,
        OutcomeKind::Unclaim,
        OutcomeKind::Bounced("550 5.1.1 stale".into()),
    ];
    let mixed: Vec<Outcome> = ids
        .iter()
        .zip(mixed)
        .map(|(&rid, k)| outcome(campaign, rid, a, k))
        .collect();
    for late in [sent_only, mixed] {
        let recorded = deliveries::record(&mut c, &late, 5).unwrap();
        assert_eq!(recorded, vec![Recorded::Lost; 4]);
    }
    assert_eq!(ledger_counts(&mut c, campaign).unwrap(), before);
    assert_eq!(
        before.get(&DeliveryState::Retry).copied(),
        Some(1),
        "B's retry stands: {before:?}"
    );
    // B's retry is claimable again; B's finished rows are not.
    let again = deliveries::claim(&mut c, campaign, &ids, 33, 30_000).unwrap();
    assert_eq!(again.owned.len(), 1);
    assert_eq!(again.finished, 3);
    deliveries::record(
        &mut c,
        &[outcome(campaign, again.owned[0].0, 33, OutcomeKind::Sent)],
        5,
    )
    .unwrap();
    assert_exact(&env, "news", 4);
}

both!(a_stale_claims_late_outcome_does_not_overwrite);

/// The PostgreSQL server `MAILSPLIT_TEST_PG` names, as an address.
fn pg_addr() -> std::net::SocketAddr {
    let base = pg_base();
    let host = base
        .rsplit('@')
        .next()
        .and_then(|h| h.split('/').next())
        .unwrap_or("127.0.0.1:5432");
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5432")
    };
    std::net::ToSocketAddrs::to_socket_addrs(&host)
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("cannot resolve {host}"))
}

/// Wait until `count` has not moved for `quiet`, up to `secs`.
fn settle(secs: u64, quiet: Duration, count: impl Fn() -> u32) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut last, mut since) = (count(), Instant::now());
    while since.elapsed() < quiet && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

/// A worker on database `url` sending to `smtp`.
fn worker(env: &Env, url: &str, smtp: &str, concurrency: u32) -> Proc {
    let concurrency = concurrency.to_string();
    Proc(
        env.cmd(&["worker", "--smtp", smtp, "--concurrency", &concurrency])
            .env("DATABASE_URL", url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Worker A (4 sessions, 3 jobs of 100 held) loses its PostgreSQL link
/// silently for one and a half leases; its relay and
/// beanstalkd stay reachable. Worker B carries on with A's jobs once their
/// TTR runs out. During the cut A sends at most its 4 in-flight messages;
/// after the heal it must not send the messages it still held (their
/// claims are B's now), so the duplicates at the relays are at most those
/// 4 too, however long the cut. (After the heal A may take new jobs: those
/// are not duplicates.)
#[test]
fn a_worker_cut_from_the_database_sends_no_more_than_its_in_flight() {
    const N: usize = 1_500;
    const A_CONCURRENCY: u32 = 4;
    let env = short_lease_world();
    let peer_a = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(50),
        ..Script::default()
    });
    let peer_b = ScriptedSmtp::start(Script::default());
    env.campaign("news", N);
    let proxy = TcpProxy::start(pg_addr());
    let proxied = env
        .db
        .url
        .replace(&pg_addr().to_string(), &format!("127.0.0.1:{}", proxy.port));
    assert_ne!(proxied, env.db.url);
    let _a = worker(&env, &proxied, &peer_a.url(), A_CONCURRENCY);
    wait_for(60, "worker A under way", || peer_a.total() >= 40);
    proxy.freeze();
    let at_cut = peer_a.total();
    let _b = worker(&env, &env.db.url, &peer_b.url(), 20);
    // Longer than a claim's lease: A's claims lapse and B takes them.
    std::thread::sleep(LEASE * 3 / 2);
    let during_cut = peer_a.total() - at_cut;
    proxy.thaw();
    wait_done(&env, "news", 120);
    // What A still held goes out now, if it is going to.
    settle(60, Duration::from_secs(5), || peer_a.total());
    let mut seen = peer_a.received.lock().unwrap().clone();
    for (rcpt, n) in peer_b.received.lock().unwrap().iter() {
        *seen.entry(rcpt.clone()).or_default() += n;
    }
    let total: u32 = seen.values().sum();
    let duplicates = total as usize - seen.len();
    assert_eq!(seen.len(), N, "every recipient reached a relay");
    assert!(
        during_cut <= A_CONCURRENCY,
        "A sent {during_cut} messages during the cut"
    );
    assert!(
        duplicates <= A_CONCURRENCY as usize,
        "{duplicates} duplicates (bound: A's {A_CONCURRENCY} in flight); A sent {} after the cut",
        peer_a.total() - at_cut
    );
    assert_exact(&env, "news", N as i64);
}

/// Worker A's PostgreSQL link goes silent both ways mid-send (a dead
/// switch: nothing carried, nothing closed, what is sent meanwhile is
/// lost), past a claim's lease, then every connection through it is reset;
/// its relay and beanstalkd stay reachable, worker B reaches the database
/// directly. Whatever A was waiting on when the link went silent, it must
/// not keep A's jobs or claims from the campaign: every recipient has an
/// outcome within a claim's lease plus a job's TTR after the reset, and A
/// sends no more than its in-flight messages twice.
#[test]
fn a_worker_whose_database_link_is_swallowed_then_reset_holds_nothing_back() {
    const N: usize = 1_500;
    const A_CONCURRENCY: u32 = 4;
    let env = short_lease_world();
    let peer_a = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(50),
        ..Script::default()
    });
    let peer_b = ScriptedSmtp::start(Script::default());
    env.campaign("news", N);
    let proxy = TcpProxy::start(pg_addr());
    let proxied = env
        .db
        .url
        .replace(&pg_addr().to_string(), &format!("127.0.0.1:{}", proxy.port));
    assert_ne!(proxied, env.db.url);
    let concurrency = A_CONCURRENCY.to_string();
    let mut a = env
        .cmd(&[
            "worker",
            "--smtp",
            &peer_a.url(),
            "--concurrency",
            &concurrency,
        ])
        .env("DATABASE_URL", &proxied)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let a_log = Log::follow(&mut a);
    let _a = Proc(a);
    wait_for(60, "worker A under way", || peer_a.total() >= 40);
    proxy.swallow();
    let at_cut = peer_a.total();
    let _b = worker(&env, &env.db.url, &peer_b.url(), 20);
    // Longer than a claim's lease: A's claims lapse and B may take them.
    std::thread::sleep(LEASE * 4 / 3);
    let during_cut = peer_a.total() - at_cut;
    proxy.reset();
    let healed = Instant::now();
    let bound = LEASE * 2 + Duration::from_secs(10);
    loop {
        let status = env.status("news");
        if status["pending"] == 0 {
            break;
        }
        assert!(
            healed.elapsed() < bound,
            "{} recipients without an outcome {bound:?} after the reset: {status}\nworker A's log:\n{}",
            status["pending"],
            a_log.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    settle(30, Duration::from_secs(3), || peer_a.total());
    let mut seen = peer_a.received.lock().unwrap().clone();
    for (rcpt, n) in peer_b.received.lock().unwrap().iter() {
        *seen.entry(rcpt.clone()).or_default() += n;
    }
    let total: u32 = seen.values().sum();
    let duplicates = total as usize - seen.len();
    assert_eq!(seen.len(), N, "every recipient reached a relay");
    assert!(
        during_cut <= A_CONCURRENCY,
        "A sent {during_cut} messages during the cut"
    );
    assert!(
        duplicates <= A_CONCURRENCY as usize,
        "{duplicates} duplicates (bound: A's {A_CONCURRENCY} in flight)"
    );
    assert_exact(&env, "news", N as i64);
}

/// The handle a worker uses, on a link that goes silent: the call whose
/// query was swallowed fails after the handle's limit instead of waiting
/// for an answer that never comes, and once the link is back the next call
/// works on a connection of its own, while the swallowed one has not been
/// reset (both of its ends still wait for the other).
#[test]
fn a_bounded_handle_gives_up_a_swallowed_call_and_carries_on() {
    let env = Env::new(Kind::Postgres, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let proxy = TcpProxy::start(pg_addr());
    let proxied = env
        .db
        .url
        .replace(&pg_addr().to_string(), &format!("127.0.0.1:{}", proxy.port));
    let limit = Duration::from_secs(2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = Db::bounded(&proxied, None, Plans::Custom, limit).unwrap();
        let read = || db.run(|c| mailsplit::store::workers::list(c).map(|rows| rows.len()));
        assert_eq!(read().await.unwrap(), 0);
        proxy.swallow();
        let asked = Instant::now();
        let stalled = read().await;
        assert!(
            matches!(stalled, Err(StoreError::Stalled(l)) if l == limit),
            "{stalled:?}"
        );
        assert!(asked.elapsed() >= limit);
        proxy.reset();
        assert_eq!(read().await.unwrap(), 0);
    });
    // The swallowed call is still blocked on its thread, and stays so.
    rt.shutdown_background();
}
