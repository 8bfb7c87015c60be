//! Signed event webhooks out: a real HTTP receiver in
//! the test checks every signature with its own HMAC, answers 500 to the
//! first two deliveries, then is down (port closed) for 30 s; in
//! the end it has every event the ledger says, in order per kind, with no
//! more duplicates than failed deliveries. A webhook with the wrong secret
//! is caught by the receiver; `webhook rm` stops delivery.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::util::*;

both!(events_reach_a_flaky_receiver_exactly_as_the_ledger_says);

/// The receiver's secret for `/hook`; `/wrong` expects it too, but its
/// webhook is registered with another.
pub(crate) const SECRET: &str = "s3cret-for-the-test";
/// How long the receiver is down (port closed) after its two 500s: half a
/// minute, as a restarting receiver is (the retry base is 200 ms in the test, so the deliverer
/// keeps knocking, doubling its wait, through the whole outage).
const DOWN: Duration = Duration::from_secs(30);

/// One request the receiver saw.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    status: u16,
    signature_ok: bool,
    events: Vec<serde_json::Value>,
}

/// A tiny HTTP/1.1 server on a fixed port: verifies `Mailsplit-Signature`
/// of every POST, answers 500 to the first `fail_first` POSTs to `/hook`,
/// then closes its port for [`DOWN`], then answers 200 to good signatures
/// and 401 to bad ones.
pub(crate) struct Receiver {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    pub(crate) fn start(fail_first: u32) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut listener = Some(listener);
            let mut failures_left = fail_first;
            loop {
                let l = listener.get_or_insert_with(|| {
                    TcpListener::bind(("127.0.0.1", port)).expect("rebind the receiver's port")
                });
                let Ok((stream, _)) = l.accept() else {
                    continue;
                };
                let went_down = handle(stream, &log, &mut failures_left);
                if went_down {
                    // Port closed: connections are refused meanwhile.
                    listener = None;
                    std::thread::sleep(DOWN);
                }
            }
        });
        Receiver { port, seen }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Every event taken (answered 200) at `path`, in the order received.
    pub(crate) fn taken(&self, path: &str) -> Vec<serde_json::Value> {
        self.seen()
            .into_iter()
            .filter(|s| s.path == path && s.status == 200)
            .flat_map(|s| s.events)
            .collect()
    }
}

/// Serve one request; true when the receiver goes down after it.
fn handle(stream: TcpStream, log: &Mutex<Vec<Seen>>, failures_left: &mut u32) -> bool {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return false;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return false;
    }
    let signature_ok = headers
        .get("mailsplit-signature")
        .is_some_and(|sig| verify(sig, &body));
    let mut went_down = false;
    let status = if path == "/hook" && *failures_left > 0 {
        *failures_left -= 1;
        went_down = *failures_left == 0;
        500
    } else if signature_ok {
        200
    } else {
        401
    };
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let events = parsed["events"].as_array().cloned().unwrap_or_default();
    log.lock().unwrap().push(Seen {
        path,
        status,
        signature_ok,
        events,
    });
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    went_down
}

/// `t=T,v1=HEX`: HMAC-SHA256 under [`SECRET`] of `T.body`, computed here.
fn verify(header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("v1", v)) => v1 = Some(v.to_string()),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let want: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    want == v1
}

/// Two text columns of every row of `sql`.
/// The (type, email) of every event the ledger says happened in campaign
/// `name`: its sent and failed deliveries, and the bounced ones.
fn ledger_events(env: &Env, name: &str) -> BTreeSet<(String, String)> {
    let of = |what: &str, cond: &str| {
        env.text_pairs(&format!(
            "SELECT '{what}' AS a, r.email AS b FROM deliveries d \
                 JOIN recipients r ON r.id = d.recipient_id \
                 JOIN campaigns c ON c.id = d.campaign_id \
                 WHERE c.name = '{name}' AND {cond}"
        ))
    };
    let mut all = BTreeSet::new();
    all.extend(of("sent", "d.state = 'sent'"));
    all.extend(of("failed", "d.state = 'failed'"));
    all.extend(of("bounced", "d.bounced_at IS NOT NULL"));
    all
}

/// `(type, email)` of events of campaign `name`.
fn keyed(events: &[serde_json::Value], name: &str) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["campaign"] == name && e["type"] != "campaign.finished")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["email"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn worker(env: &Env) -> Proc {
    Proc(
        env.cmd(&["worker", "--smtp", &env.smtp])
            .env("MAILSPLIT_WEBHOOK_RETRY_BASE_MS", "200")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn events_reach_a_flaky_receiver_exactly_as_the_ledger_says(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            // ~1 in 8 refused at RCPT with 550 5.1.1: failed and bounced.
            reject_every: Some(8),
            ..Script::default()
        },
    );
    let receiver = Receiver::start(2);
    env.import_n("news", 300);
    env.create_campaign("news", "news", &["--max-failure-rate", "90%"]);
    let kinds = "sent,failed,bounced,campaign.finished";
    let added = env.ok(&[
        "webhook",
        "add",
        &receiver.url("/hook"),
        "--events",
        kinds,
        "--secret",
        SECRET,
        // The test's receiver runs on this machine.
        "--allow-local",
    ]);
    assert!(added.contains("added webhook"), "{added}");
    // Registered with another secret than the receiver checks.
    env.ok(&[
        "webhook",
        "add",
        &receiver.url("/wrong"),
        "--events",
        "sent",
        "--secret",
        "not-it",
        "--allow-local",
    ]);
    env.ok(&["enqueue", "news"]);
    let _w = worker(&env);
    wait_done(&env, "news", 120);

    check_everything_arrived(&env, &receiver);
    check_rm_stops_delivery(&env, &receiver);
}

/// Every event of the ledger, signed, in order per kind; the wrong secret
/// caught; `ls` shows the 401 and no secret.
fn check_everything_arrived(env: &Env, receiver: &Receiver) {
    // Everything arrives, though the first two POSTs got 500 and the port
    // was closed for a while after them.
    let want = ledger_events(env, "news");
    assert!(want.iter().any(|(t, _)| t == "failed"), "{want:?}");
    assert!(want.iter().any(|(t, _)| t == "bounced"), "{want:?}");
    wait_for(90, "every event of the ledger at the receiver", || {
        let got: BTreeSet<_> = keyed(&receiver.taken("/hook"), "news")
            .into_iter()
            .collect();
        got == want
            && receiver
                .taken("/hook")
                .iter()
                .any(|e| e["type"] == "campaign.finished")
    });
    let seen = receiver.seen();
    let hook: Vec<&Seen> = seen.iter().filter(|s| s.path == "/hook").collect();
    assert!(
        hook.iter().all(|s| s.signature_ok),
        "a bad signature at /hook"
    );
    let refused = hook.iter().filter(|s| s.status != 200).count();
    assert_eq!(refused, 2, "the two 500s");
    let taken = keyed(&receiver.taken("/hook"), "news");
    let duplicates = taken.len() - want.len();
    // A batch is sent again only when its answer was lost: never here.
    assert!(duplicates <= refused, "{duplicates} duplicates");
    // Every event has an id; a batch sent again after a refusal carries
    // the same ids, so a receiver can drop what it has seen.
    let mut by_id: BTreeMap<i64, (String, String)> = BTreeMap::new();
    for e in receiver.taken("/hook") {
        let id = e["id"].as_i64().unwrap_or_else(|| panic!("no id: {e}"));
        let what = (e["type"].to_string(), e["email"].to_string());
        let first = by_id.entry(id).or_insert_with(|| what.clone());
        assert_eq!(*first, what, "event id {id} names two events");
    }
    assert_eq!(
        by_id.len(),
        want.len() + 1,
        "one id per event (and campaign.finished)"
    );
    let finished = receiver
        .taken("/hook")
        .into_iter()
        .filter(|e| e["type"] == "campaign.finished")
        .count();
    assert_eq!(finished, 1);

    // In order per kind: the times of each kind never go back.
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for e in receiver.taken("/hook") {
        let (t, at) = (e["type"].as_str().unwrap(), e["at"].as_str().unwrap());
        let prev = last.insert(t.to_string(), at.to_string());
        assert!(prev.as_deref() <= Some(at), "{t}: {prev:?} then {at}");
    }

    // The receiver caught the wrong secret; `ls` says so, and shows no secret.
    // `/wrong` backs off on its own through the outage (its doubling wait
    // may put its next knock well after `/hook` got everything).
    wait_for(90, "a call to /wrong", || {
        receiver.seen().iter().any(|s| s.path == "/wrong")
    });
    let seen = receiver.seen();
    assert!(seen.iter().any(|s| s.path == "/wrong" && !s.signature_ok));
    assert!(seen.iter().all(|s| s.path != "/wrong" || s.status == 401));
    // (the deliverer records the answer just after the receiver logged it)
    wait_for(30, "the 401 in `webhook ls`", || {
        env.ok(&["webhook", "ls"]).contains("HTTP 401")
    });
    let ls = env.ok(&["webhook", "ls"]);
    assert!(!ls.contains(SECRET) && !ls.contains("not-it"), "{ls}");
    let line = ls.lines().find(|l| l.contains("/hook ")).unwrap();
    assert!(line.contains("pending 0"), "{ls}");
}

fn check_rm_stops_delivery(env: &Env, receiver: &Receiver) {
    let ls = env.ok(&["webhook", "ls"]);
    // `webhook rm` stops delivery: the next campaign's events never reach
    // the removed webhook, while the other one gets them.
    let wrong_id = ls
        .lines()
        .find(|l| l.contains("/wrong"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    env.ok(&["webhook", "rm", &wrong_id]);
    env.create_campaign("later", "news", &["--max-failure-rate", "90%"]);
    env.ok(&["enqueue", "later"]);
    wait_done(env, "later", 120);
    wait_for(60, "the second campaign's end at the receiver", || {
        receiver
            .taken("/hook")
            .iter()
            .any(|e| e["type"] == "campaign.finished" && e["campaign"] == "later")
    });
    let late = receiver
        .seen()
        .into_iter()
        .filter(|s| s.path == "/wrong")
        .flat_map(|s| s.events)
        .filter(|e| e["campaign"] == "later")
        .count();
    assert_eq!(late, 0, "events of a webhook removed before they happened");
    let ls = env.ok(&["webhook", "ls"]);
    assert!(!ls.contains("/wrong"), "{ls}");
}

#[test]
fn add_refuses_what_is_not_http_and_shows_a_generated_secret_once() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    for url in [
        "ftp://hooks.example/x",
        "file:///etc/passwd",
        "hooks.example",
    ] {
        let out = env.run(&["webhook", "add", url, "--events", "sent"]);
        assert_eq!(out.status.code(), Some(2), "{url}: {}", stderr(&out));
        assert!(stderr(&out).contains("http"), "{}", stderr(&out));
    }
    let out = env.run(&[
        "webhook",
        "add",
        "https://h.example/",
        "--events",
        "sent,nope",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("campaign.finished"),
        "{}",
        stderr(&out)
    );
    let added = env.ok(&[
        "webhook",
        "add",
        "https://h.example/in",
        "--events",
        "failed",
    ]);
    let secret = added
        .lines()
        .find(|l| l.len() == 64 && l.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no generated secret in {added}"));
    let ls = env.ok(&["webhook", "ls"]);
    assert!(ls.contains("https://h.example/in"), "{ls}");
    assert!(!ls.contains(secret), "{ls}");
    let out = env.run(&["webhook", "rm", "999"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `webhook add` refuses a receiver on this machine or its link in every
/// spelling (exit 2, saying how to allow it), and takes it with
/// `--allow-local`.
#[test]
fn add_refuses_local_receivers_unless_allowed() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    for url in [
        "http://127.0.0.1:9/in",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://127.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0:8080/",
        "http://localhost:9/in",
    ] {
        let out = env.run(&["webhook", "add", url, "--events", "sent"]);
        assert_eq!(out.status.code(), Some(2), "{url}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("--allow-local"), "{url}: {err}");
        assert!(
            ["loopback", "link-local", "unspecified"]
                .iter()
                .any(|k| err.contains(k)),
            "{url}: {err}"
        );
    }
    assert!(env.ok(&["webhook", "ls"]).contains("no webhooks"));
    let added = env.ok(&[
        "webhook",
        "add",
        "http://127.0.0.1:9/in",
        "--events",
        "sent",
        "--allow-local",
    ]);
    assert!(added.contains("added webhook"), "{added}");
}

/// A webhook whose host resolves to loopback when it is delivered (its
/// name was rebound since `webhook add`) gets nothing: the deliverer
/// checks the addresses it connects to, and says why in `webhook ls`.
#[test]
fn the_deliverer_refuses_a_host_that_resolves_to_loopback() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    let receiver = TcpListener::bind("127.0.0.1:0").unwrap();
    receiver.set_nonblocking(true).unwrap();
    let port = receiver.local_addr().unwrap().port();
    // Accepted as written (a documentation address, nothing local)...
    env.ok(&[
        "webhook",
        "add",
        &format!("http://192.0.2.10:{port}/in"),
        "--events",
        "campaign.finished",
    ]);
    // ...then the name it uses resolves to this machine.
    env.sql(&format!(
        "UPDATE webhooks SET url = 'http://localhost:{port}/in'"
    ));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    env.sql(&format!(
        "INSERT INTO webhook_outbox (webhook_id, kind, at) \
         SELECT id, 'campaign.finished', {now_ms} FROM webhooks"
    ));
    let _s = env.serve(None);
    let mut ls = String::new();
    wait_for(30, "the deliverer's refusal in webhook ls", || {
        ls = env.ok(&["webhook", "ls"]);
        ls.contains("last error")
    });
    assert!(ls.contains("resolves to"), "{ls}");
    assert!(ls.contains("loopback"), "{ls}");
    assert!(ls.contains("--allow-local"), "{ls}");
    assert!(ls.contains("delivered 0  pending 1"), "{ls}");
    match receiver.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the deliverer connected to loopback: {other:?}"),
    }
}
