//! What a careless operator or a hostile client
//! could do to memory, threads and sockets through `rate set` and
//! `serve`, against the real servers (beanstalkd, smtp-sink, SQLite) and
//! real sockets (a "beanstalkd" that accepts and never answers, clients
//! that send half a header).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;

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

// ------------------------------------------------- rate bounds

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
    let mut env = World::new(Kind::Sqlite);
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

// --------------------------------------- a hung beanstalkd

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

/// With a beanstalkd that accepts and never answers and
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

// ------------------------------------------------ slow clients

/// Let this test process hold `n` sockets (the soft limit is often 1,024).
fn allow_open_files(n: u64) {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        assert!(l.rlim_max >= n, "hard open-file limit {} < {n}", l.rlim_max);
        l.rlim_cur = l.rlim_cur.max(n);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
    }
}

/// `mailsplit serve` on free ports with `extra` options, its log kept.
fn serve_with(env: &Env, extra: &[&str]) -> Served {
    let (public, admin) = (free_port(), free_port());
    let (listen, admin_listen) = (format!("127.0.0.1:{public}"), format!("127.0.0.1:{admin}"));
    let mut args = vec![
        "serve",
        "--listen",
        &listen,
        "--admin-listen",
        &admin_listen,
    ];
    args.extend_from_slice(extra);
    let mut cmd = env.cmd(&args);
    cmd.env("MAILSPLIT_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // The usual soft limit of 1,024 open files, whatever this test raised
    // its own to.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l.rlim_cur = l.rlim_max.min(1_024);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        });
    }
    let proc = Proc(cmd.spawn().unwrap());
    wait_port(public);
    wait_port(admin);
    Served {
        proc,
        public,
        admin,
    }
}

/// A client that connects and sends half a request header, then nothing.
fn half_header(port: u16) -> Option<std::net::TcpStream> {
    use std::io::Write;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    Some(s)
}

/// Whether the server closed `s` within `secs` (a read that ends, rather
/// than one that times out).
fn closed_within(mut s: std::net::TcpStream, secs: u64) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// 1,100 clients that send half a header each, on both
/// listeners, while the cap is 512 per listener: `/healthz`, a one-click
/// unsubscribe and the admin API still answer, and SIGTERM still exits
/// promptly.
#[test]
fn a_flood_of_half_headers_starves_nothing() {
    const SLOW: usize = 1_100;
    allow_open_files(4 * SLOW as u64 + 256);
    let env = World::new(Kind::Sqlite);
    env.campaign_without_enqueue("news", 3);
    let path = one_click_path(&env, "news", "news");
    let mut s = serve_with(&env, &["--max-connections", "512"]);
    let slow: Vec<_> = (0..SLOW)
        .flat_map(|_| [half_header(s.public), half_header(s.admin)])
        .flatten()
        .collect();
    assert!(
        slow.len() >= SLOW,
        "only {} slow clients connected",
        slow.len()
    );
    let health = http("GET", s.public, "/healthz", &[], None);
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let r = http(
        "POST",
        s.public,
        &path,
        &[],
        Some("List-Unsubscribe=One-Click"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let api = http(
        "GET",
        s.admin,
        "/api/campaigns",
        &[("Authorization", &auth)],
        None,
    );
    assert_eq!(api.status, 200, "{}", api.body);
    let started = Instant::now();
    signal(&s.proc.0, "TERM");
    assert!(wait_exit(&mut s.proc.0, 10).success());
    eprintln!(
        "{} slow clients; SIGTERM to exit {:?}",
        slow.len(),
        started.elapsed()
    );
}

/// The case: with three half-header connections open, SIGTERM
/// exits within a few seconds (it took 28).
#[test]
fn sigterm_with_half_headers_open_exits_promptly() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let mut s = serve_with(&env, &[]);
    let slow: Vec<_> = (0..3).filter_map(|_| half_header(s.public)).collect();
    assert_eq!(slow.len(), 3);
    // The three are being read by now: a request behind them is answered.
    assert_eq!(http("GET", s.public, "/u/x", &[], None).status, 404);
    let started = Instant::now();
    signal(&s.proc.0, "TERM");
    let status = wait_exit(&mut s.proc.0, 30);
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(8), "SIGTERM took {took:?}");
}

/// A client that sends half a header, one that sends nothing and one kept
/// alive after a whole request are each closed by the server (header-read
/// and idle timeouts), while a client that finishes its request is served.
#[test]
fn slow_and_idle_connections_are_closed() {
    use std::io::Write;
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let s = serve_with(&env, &[]);
    let half = half_header(s.public).unwrap();
    let silent = std::net::TcpStream::connect(("127.0.0.1", s.public)).unwrap();
    let mut kept = std::net::TcpStream::connect(("127.0.0.1", s.public)).unwrap();
    kept.write_all(b"GET /u/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let checks: Vec<_> = [
        ("half a header", half),
        ("silent", silent),
        ("kept alive", kept),
    ]
    .into_iter()
    .map(|(what, conn)| std::thread::spawn(move || (what, closed_within(conn, 40))))
    .collect();
    for c in checks {
        let (what, closed) = c.join().unwrap();
        assert!(closed, "{what}: still open after 40 s");
    }
}
