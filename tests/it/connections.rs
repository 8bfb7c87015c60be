//! Connections are a limit too: a relay greets only so many sessions at
//! once (Postfix's process limit, a provider's per-IP cap), and the
//! connection beyond it is accepted by the kernel but never greeted. A
//! sender opens its session before it takes a message, the session count
//! adapts to what the relay greets, a relay's shared `--connections` limit
//! holds across workers, and a session QUITs after `--max-per-session`.

use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::postfix::{Options, Postfix};
use crate::util::*;

/// Lines a worker writes on stderr, each with when it came.
type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

fn collect_stderr(w: &mut Proc) -> Lines {
    let lines: Lines = Default::default();
    let err = w.0.stderr.take().unwrap();
    let out = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            out.lock().unwrap().push((Instant::now(), line));
        }
    });
    lines
}

/// Run campaign `name` with `workers` × `--concurrency concurrency` until
/// it is done; the recipients per second from the workers' start, and
/// their stderr lines.
fn run_campaign(
    env: &Env,
    name: &str,
    list: &str,
    n: usize,
    workers: usize,
    concurrency: &str,
) -> (f64, Instant, Vec<Lines>) {
    env.create_campaign(name, list, &[]);
    env.ok(&["enqueue", name]);
    let started = Instant::now();
    let mut procs: Vec<Proc> = (0..workers)
        .map(|_| env.worker(&["--concurrency", concurrency]))
        .collect();
    let logs: Vec<Lines> = procs.iter_mut().map(collect_stderr).collect();
    wait_done(env, name, 300);
    let secs = started.elapsed().as_secs_f64();
    let s = env.status(name);
    assert_eq!(s["sent"], n as i64, "{s}");
    drop(procs);
    (n as f64 / secs, started, logs)
}

/// A stock Postfix (default_process_limit 100) as the relay: 3 workers ×
/// 100 sessions want 300 sessions from it. Before, the senders beyond the
/// 100th held a message each while they waited 30 s for a greeting that
/// never came, their jobs with them, and the campaign crawled (12 msg/s,
/// unfinished after minutes). Now they hold nothing while they wait, the
/// session count shrinks to what Postfix greets, and the campaign runs at
/// about the rate 1 worker × 50 sessions reaches (the bar is 75 % of it:
/// CI's loaded machine measured 90 %, the old design 4 %).
#[test]
fn three_workers_of_100_sessions_through_a_stock_postfix() {
    let _alone = crate::util::alone();
    // Long enough that the rate is the campaign's, not the start-up of
    // three processes against one on a 2-core machine (a 13 s run came
    // out at 87-134 % of the reference from run to run; at the 220/s this
    // relay takes here, 6,000 are a 27 s run), and that the fleet runs on
    // for seconds after the 15 s warm-up in which connect failures are
    // allowed. Every thousand costs seconds of a test that runs with
    // nothing beside it.
    const N: usize = 6_000;
    // The reference (1 worker x 50 sessions) needs no warm-up to sit out:
    // 2,000 measure its rate; its start-up weighs more in a shorter run,
    // which lowers the bar by a few per cent, far above the old design's
    // 4 %.
    const REFERENCE_N: usize = 2_000;
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let pf = Postfix::start(Options {
        transports: vec![("example.test".into(), "discard:".into())],
        ..Options::default()
    });
    // PostgreSQL: three processes writing one SQLite file would measure
    // SQLite's write lock, not the sessions.
    let mut env = Env::new(Kind::Postgres, &bs.addr());
    env.smtp = pf.smtp_url();
    env.import_bulk("news", N);
    env.import_n("reference", REFERENCE_N);

    // The machine's load drifts: the reference is measured before and
    // after, and their mean is the bar.
    let (before, _, _) = run_campaign(&env, "reference", "reference", REFERENCE_N, 1, "50");
    let (fleet, started, logs) = run_campaign(&env, "fleet", "news", N, 3, "100");
    let (after, _, _) = run_campaign(&env, "reference-again", "reference", REFERENCE_N, 1, "50");
    let reference = (before + after) / 2.0;
    // A worker's warm-up is its first 15 s, from its first line on stderr
    // (on a loaded machine a worker may start seconds after the others, to
    // find the relay full: its first round of connects fails, as it must).
    // A connect belongs to the moment it began: a greeting timeout is
    // logged 10 s later.
    let mut early = 0;
    let mut late = Vec::new();
    for log in &logs {
        let log = log.lock().unwrap();
        let origin = log.first().map_or(started, |(at, _)| *at);
        let warm_up = origin + Duration::from_secs(15);
        for (at, line) in log.iter() {
            if !line.contains("SMTP connect failed") {
                continue;
            }
            let begun = if line.contains("no reply within") {
                at.checked_sub(mailsplit::config::CONNECT_TIMEOUT)
                    .unwrap_or(*at)
            } else {
                *at
            };
            if begun < warm_up {
                early += 1;
            } else {
                late.push(line.clone());
            }
        }
    }
    let shrunk = logs.iter().any(|l| {
        l.lock()
            .unwrap()
            .iter()
            .any(|(_, line)| line.contains("fewer sessions"))
    });
    eprintln!(
        "stock Postfix, {N} recipients: 1 worker x 50 sessions {before:.0}/s and {after:.0}/s, 3 workers x 100 sessions {fleet:.0}/s; connect failures {early} in the first 15 s, {} after; session count shrunk: {shrunk}",
        late.len()
    );
    for l in &late {
        eprintln!("late: {l}");
    }
    assert!(
        fleet >= 0.75 * reference,
        "3 x 100 sessions ran at {fleet:.0}/s, under 75 % of 1 x 50 ({reference:.0}/s)"
    );
    assert!(
        late.is_empty(),
        "connect failures after the warm-up: {late:#?}"
    );
}

/// Recipients each accepted once, and all of them.
fn exactly_once(peer: &ScriptedSmtp, n: usize) {
    let received = peer.received.lock().unwrap();
    assert_eq!(received.len(), n);
    assert!(received.values().all(|&c| c == 1), "duplicates");
}

/// A relay that greets at most 6 sessions at once, and 2 workers × 20
/// senders. With the relay's shared limit set to 6 no connection is ever
/// left waiting for its greeting; without it the workers shrink to what the
/// relay greets. Either way every recipient gets the message exactly once.
fn relay_that_greets_at_most_n(kind: Kind) {
    const GREETS: usize = 6;
    let script = Script {
        max_greeted: Some(GREETS),
        data_delay: Duration::from_millis(20),
        ..Script::default()
    };
    // With the shared limit.
    let env = World::with_peer(kind, script.clone());
    let peer = env.peer();
    env.import_n("news", 1_200);
    let group = format!("relay:127.0.0.1:{}", peer.port);
    let said = env.ok(&["rate", "set", &group, "10000/s", "--connections", "6"]);
    assert!(said.contains("6 sessions"), "{said}");
    env.create_campaign("limited", "news", &[]);
    env.ok(&["enqueue", "limited"]);
    let workers: Vec<Proc> = (0..2)
        .map(|_| env.worker(&["--concurrency", "20"]))
        .collect();
    wait_done(&env, "limited", 120);
    let list = env.ok(&["rate", "list"]);
    assert!(
        list.contains(&group) && list.contains("connections     6"),
        "{list}"
    );
    for w in workers {
        stop_worker(w);
    }
    exactly_once(peer, 1_200);
    let peak = peer
        .peak_connections
        .load(std::sync::atomic::Ordering::SeqCst);
    let waited = peer.ungreeted.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("--connections 6: peak {peak} connections, {waited} left ungreeted");
    assert!(peak <= GREETS, "{peak} connections at once, limit 6");
    assert_eq!(waited, 0, "connections left waiting for the greeting");
    // Both workers got slots (a fair share, not one worker holding all).
    assert!(peer.session_ends.lock().unwrap().len() >= 2);
    // Stopped workers hold no slot.
    wait_for(15, "the leases to go", || {
        env.ok(&["rate", "list"]).contains("in use     0")
    });
    // Workers killed with -9 while they hold slots: nobody gives them
    // back, their leases expire.
    env.create_campaign("killed", "news", &[]);
    env.ok(&["enqueue", "killed"]);
    let workers: Vec<Proc> = (0..2)
        .map(|_| env.worker(&["--concurrency", "20"]))
        .collect();
    wait_for(30, "sessions under the limit", || {
        env.ok(&["rate", "list"]).contains("in use     6")
    });
    drop(workers);
    let killed = Instant::now();
    wait_for(20, "a killed worker's slots to come back", || {
        env.ok(&["rate", "list"]).contains("in use     0")
    });
    eprintln!(
        "slots of workers killed with -9 back after {:.1} s",
        killed.elapsed().as_secs_f64()
    );

    // Without it: the senders beyond the 6th wait for a greeting that does
    // not come, holding no message; the session count shrinks.
    // Slower messages: the campaign outlasts the greeting timeout (10 s).
    let script = Script {
        data_delay: Duration::from_millis(60),
        ..script
    };
    let (_tmp2, _bs2, peer, env) = setup(kind, script);
    env.import_n("news", 1_500);
    env.create_campaign("open", "news", &[]);
    env.ok(&["enqueue", "open"]);
    let mut workers: Vec<Proc> = (0..2)
        .map(|_| env.worker(&["--concurrency", "20"]))
        .collect();
    let logs: Vec<Lines> = workers.iter_mut().map(collect_stderr).collect();
    wait_done(&env, "open", 120);
    drop(workers);
    exactly_once(&peer, 1_500);
    let waited = peer.ungreeted.load(std::sync::atomic::Ordering::SeqCst);
    let shrunk = logs.iter().any(|l| {
        l.lock()
            .unwrap()
            .iter()
            .any(|(_, line)| line.contains("fewer sessions"))
    });
    eprintln!("no limit: {waited} connections left ungreeted; shrunk: {shrunk}");
    assert!(waited > 0, "the relay's limit was never reached: no test");
    assert!(shrunk, "the session count never shrank");
}

both!(relay_that_greets_at_most_n);

/// A relay slower than `--smtp-timeout`: the worker gives up on the reply
/// and drops the session without QUIT (its state is unknown), so a relay
/// that answers late sees the connection closed after its 250, not a
/// session that ended well; the message was sent though the worker never
/// heard it (the in-doubt case of the delivery semantics).
#[test]
fn a_timed_out_try_drops_its_session_without_quit() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            // why: 2 s past the timeout, so even a worker starved that
            // long times out before the 250 can reach it
            data_delay: Duration::from_secs(3),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.campaign("news", 1);
    let w = env.worker(&[
        "--concurrency",
        "1",
        "--smtp-timeout",
        "1",
        "--max-attempts",
        "1",
    ]);
    wait_done(&env, "news", 30);
    wait_for(10, "the late 250's session to end", || {
        !peer.unheard.lock().unwrap().is_empty()
    });
    stop_worker(w);
    let received = peer.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(*peer.unheard.lock().unwrap(), received);
    let ends = peer.session_ends.lock().unwrap().clone();
    let carried: Vec<&SessionEnd> = ends.iter().filter(|e| e.messages > 0).collect();
    assert_eq!(carried.len(), 1, "{ends:?}");
    assert!(!carried[0].quit, "QUIT after a timed-out try: {ends:?}");
}

/// `--max-per-session 7`: no session carries more than 7 messages, and
/// each ends with QUIT (also the last ones, when the worker stops).
#[test]
fn sessions_quit_after_max_per_session() {
    let env = World::with_peer(Kind::Sqlite, Script::default());
    let peer = env.peer();
    env.campaign("news", 100);
    let w = env.worker(&["--concurrency", "4", "--max-per-session", "7"]);
    wait_done(&env, "news", 60);
    stop_worker(w);
    exactly_once(peer, 100);
    let ends = peer.session_ends.lock().unwrap().clone();
    let carried: Vec<&SessionEnd> = ends.iter().filter(|e| e.messages > 0).collect();
    let total: u32 = carried.iter().map(|e| e.messages).sum();
    assert_eq!(total, 100, "{ends:?}");
    assert!(carried.iter().all(|e| e.messages <= 7), "{ends:?}");
    assert!(carried.len() >= 15, "{ends:?}");
    assert!(
        ends.iter().all(|e| e.quit),
        "a session ended without QUIT: {ends:?}"
    );
}
