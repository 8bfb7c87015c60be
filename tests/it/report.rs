//! `mailsplit report` (issue 26 item 3): a campaign sent to a relay that
//! refuses one domain; the report's outcomes by domain, bounce reasons,
//! versions, rate per minute and unsubscribes match the ledger. The
//! one-click unsubscribe is also reported by `serve` to a webhook.

use std::io::Write;

use crate::util::*;

both!(report_shows_outcomes_by_domain_and_reasons);

/// 20 recipients at each of good.example and bad.example, and 2 at each
/// of five small domains.
fn write_domains_csv(env: &Env) -> String {
    let path = env.dir.path().join("people.csv");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "email,name").unwrap();
    for i in 0..20 {
        writeln!(f, "g{i}@good.example,G").unwrap();
        writeln!(f, "b{i}@Bad.Example,B").unwrap();
    }
    for i in 0..10 {
        writeln!(f, "s{i}@small{}.example,S", i % 5).unwrap();
    }
    path.to_str().unwrap().to_string()
}

fn report_shows_outcomes_by_domain_and_reasons(kind: Kind) {
    let (_tmp, _bs, _peer, env) = setup(
        kind,
        Script {
            reject: Some("bad.example".into()),
            ..Script::default()
        },
    );
    let csv = write_domains_csv(&env);
    env.ok(&["migrate"]);
    env.ok(&["import", &csv, "--list", "people"]);
    env.create_campaign("spring", "people", &["--max-failure-rate", "90%"]);
    env.ok(&["enqueue", "spring"]);
    let w = env.worker(&[]);
    wait_done(&env, "spring", 120);
    stop_worker(w);

    let out = env.ok(&["report", "spring", "--json", "--top", "2"]);
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (r["sent"].as_i64(), r["failed"].as_i64()),
        (Some(30), Some(20)),
        "{r}"
    );
    let domains = r["domains"].as_array().unwrap();
    assert_eq!(domains.len(), 3, "{r}");
    let d = |name: &str| {
        domains
            .iter()
            .find(|d| d["domain"] == name)
            .unwrap_or_else(|| panic!("no {name} in {r}"))
    };
    assert_eq!(
        (
            d("bad.example")["failed"].as_i64(),
            d("bad.example")["sent"].as_i64()
        ),
        (Some(20), Some(0))
    );
    assert_eq!(
        d("bad.example")["bounced"],
        20,
        "5.1.1 at send time is a hard bounce"
    );
    assert_eq!(
        (
            d("good.example")["sent"].as_i64(),
            d("good.example")["failed"].as_i64()
        ),
        (Some(20), Some(0))
    );
    assert_eq!(
        (
            d("other")["recipients"].as_i64(),
            d("other")["sent"].as_i64()
        ),
        (Some(10), Some(10))
    );

    let reasons = r["bounce_reasons"].as_array().unwrap();
    assert_eq!(
        reasons.len(),
        1,
        "one reason once addresses are taken out: {r}"
    );
    assert_eq!(reasons[0]["code"], "5.1.1");
    assert_eq!(reasons[0]["count"], 20);
    assert_eq!(reasons[0]["source"], "send");
    assert!(
        reasons[0]["text"]
            .as_str()
            .unwrap()
            .contains("no such user"),
        "{r}"
    );

    assert_eq!(
        r["versions_sent"],
        serde_json::json!([{"version": 1, "sent": 30}])
    );
    let minutes = r["rate_per_minute"].as_array().unwrap();
    let sum = |k: &str| minutes.iter().map(|m| m[k].as_i64().unwrap()).sum::<i64>();
    assert_eq!((sum("sent"), sum("failed")), (30, 20), "{r}");
    assert!(
        minutes
            .iter()
            .all(|m| m["minute"].as_str().unwrap().ends_with(":00Z")),
        "{r}"
    );
    assert!(r["tracking"].is_null(), "{r}");
    assert_eq!(r["unsubscribed"], 0);

    let text = env.ok(&["report", "spring"]);
    assert!(
        text.contains("bad.example") && text.contains("5.1.1"),
        "{text}"
    );
    let out = env.run(&["report", "nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A one-click unsubscribe while only `serve` runs: `serve` delivers the
/// `unsubscribed` event, and the report counts it for the campaign.
#[test]
fn serve_delivers_an_unsubscribe_event_and_the_report_counts_it() {
    let (_tmp, _bs, _peer, env) = setup(Kind::Sqlite, Script::default());
    let receiver = Receiver::start();
    env.import_n("news", 5);
    let s = env.serve(None);
    let base = format!("http://127.0.0.1:{}", s.public);
    env.create_campaign("news", "news", &["--public-url", &base]);
    env.ok(&["enqueue", "news"]);
    let w = env.worker(&[]);
    wait_done(&env, "news", 60);
    stop_worker(w);
    env.ok(&[
        "webhook",
        "add",
        &format!("http://127.0.0.1:{}/in", receiver.port),
        "--events",
        "unsubscribed",
        // The test's receiver runs on this machine.
        "--allow-local",
    ]);
    let message = env.ok(&["preview", "news", "--recipient", "user2@example.test"]);
    let link = header(&message, "List-Unsubscribe")[0]
        .trim_matches(['<', '>'])
        .to_string();
    let answer = ureq::post(&link)
        .send_form(&[("List-Unsubscribe", "One-Click")])
        .unwrap();
    assert_eq!(answer.status(), 200);
    wait_for(30, "the unsubscribe at the receiver", || {
        receiver.bodies().iter().any(|b| b.contains("unsubscribed"))
    });
    let body: serde_json::Value = serde_json::from_str(&receiver.bodies()[0]).unwrap();
    let e = &body["events"][0];
    assert_eq!(
        (e["type"].as_str(), e["campaign"].as_str()),
        (Some("unsubscribed"), Some("news"))
    );
    assert_eq!(e["email"], "user2@example.test");
    let r: serde_json::Value =
        serde_json::from_str(env.ok(&["report", "news", "--json"]).trim()).unwrap();
    assert_eq!(r["unsubscribed"], 1, "{r}");
}

/// Answers 200 to every POST and keeps the bodies.
struct Receiver {
    port: u16,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Receiver {
    fn start() -> Receiver {
        use std::io::{BufRead, BufReader, Read};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&bodies);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; len];
                if reader.read_exact(&mut body).is_ok() {
                    log.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&body).into_owned());
                }
                let _ = reader
                    .into_inner()
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
            }
        });
        Receiver { port, bodies }
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }
}
