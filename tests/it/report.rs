//! `mailsplit report`: a campaign sent to a relay that
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
    let env = World::with_peer(
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
    // The report's status fields are `status --json`'s, versions included.
    assert_eq!(r["content_version"], 1, "{r}");
    assert_eq!(r["versions"], serde_json::json!({"1": 30}), "{r}");
    let status: serde_json::Value =
        serde_json::from_str(env.ok(&["status", "spring", "--json"]).trim()).unwrap();
    for key in ["content_version", "versions", "sent", "failed", "state"] {
        assert_eq!(
            r[key], status[key],
            "{key}: report {r} against status {status}"
        );
    }
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

/// A one-click unsubscribe and a click while only `serve` runs: `serve`
/// delivers the `unsubscribed` and `clicked` events (the click with its
/// link's URL, each event with an id), and the report counts them.
#[test]
fn serve_delivers_unsubscribe_and_click_events_and_the_report_counts_them() {
    let env = World::with_peer(Kind::Sqlite, Script::default());
    let receiver = Receiver::start();
    env.import_n("news", 5);
    let s = env.serve(None);
    let base = format!("http://127.0.0.1:{}", s.public);
    let html = env.dir.path().join("news.html");
    std::fs::write(
        &html,
        "<p>Hi {{ name }}: <a href=\"https://shop.example/sale?a=1&amp;b=2\">sale</a></p>\n\
         <p><a href=\"{{ unsubscribe_url }}\">Unsubscribe</a></p>\n",
    )
    .unwrap();
    env.ok(&[
        "campaign",
        "create",
        "news",
        "--list",
        "news",
        "--html",
        html.to_str().unwrap(),
        "--subject",
        "Hi",
        "--from",
        "news@example.test",
        "--public-url",
        &base,
        "--track",
        "clicks",
    ]);
    env.ok(&["enqueue", "news"]);
    let w = env.worker(&[]);
    wait_done(&env, "news", 60);
    stop_worker(w);
    env.ok(&[
        "webhook",
        "add",
        &format!("http://127.0.0.1:{}/in", receiver.port),
        "--events",
        "unsubscribed,clicked",
        // The test's receiver runs on this machine.
        "--allow-local",
    ]);
    let unsubscribe = |message: &str| {
        let link = header(message, "List-Unsubscribe")[0]
            .trim_matches(['<', '>'])
            .to_string();
        match ureq::post(&link).send_form(&[("List-Unsubscribe", "One-Click")]) {
            Ok(answer) => answer.status(),
            Err(ureq::Error::Status(status, _)) => status,
            Err(e) => panic!("{link}: {e}"),
        }
    };
    let click = |message: &str| {
        let at = message
            .find(&format!("href=\"{base}/c/"))
            .expect("a tracked link")
            + 6;
        let link: String = message[at..].chars().take_while(|c| *c != '"').collect();
        let agent = ureq::AgentBuilder::new().redirects(0).build();
        let answer = agent
            .get(&link)
            .call()
            .unwrap_or_else(|e| panic!("{link}: {e}"));
        assert_eq!(answer.status(), 302, "{link}");
        assert_eq!(
            answer.header("Location"),
            Some("https://shop.example/sale?a=1&b=2")
        );
    };
    // An operator reading user4's preview follows both its links: they
    // work, and act for nobody.
    let preview = env.ok(&["preview", "news", "--recipient", "user4@example.test"]);
    assert_eq!(unsubscribe(&preview), 404, "a preview's link names nobody");
    click(&preview);
    // user2 unsubscribes and user3 clicks the sale link, each from their
    // own message.
    unsubscribe(&env.ok(&[
        "preview",
        "news",
        "--recipient",
        "user2@example.test",
        "--real-links",
    ]));
    click(&env.ok(&[
        "preview",
        "news",
        "--recipient",
        "user3@example.test",
        "--real-links",
    ]));
    wait_for(30, "both events at the receiver", || {
        let all = receiver.bodies().concat();
        all.contains("\"unsubscribed\"") && all.contains("\"clicked\"")
    });
    let events: Vec<serde_json::Value> = receiver
        .bodies()
        .iter()
        .flat_map(|b| {
            let body: serde_json::Value = serde_json::from_str(b).unwrap();
            body["events"].as_array().unwrap().clone()
        })
        .collect();
    let of = |kind: &str| events.iter().find(|e| e["type"] == kind).unwrap().clone();
    let (unsub, clicked) = (of("unsubscribed"), of("clicked"));
    assert_eq!(
        (unsub["campaign"].as_str(), unsub["email"].as_str()),
        (Some("news"), Some("user2@example.test"))
    );
    assert!(unsub.get("url").is_none(), "{unsub}");
    assert_eq!(clicked["email"], "user3@example.test", "{clicked}");
    assert_eq!(
        clicked["url"], "https://shop.example/sale?a=1&b=2",
        "{clicked}"
    );
    let ids: Vec<i64> = events.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] != w[1]), "{ids:?}");
    let r: serde_json::Value =
        serde_json::from_str(env.ok(&["report", "news", "--json"]).trim()).unwrap();
    assert_eq!(r["unsubscribed"], 1, "{r}");
    assert_eq!(r["tracking"]["clicked"], 1, "{r}");
    assert_eq!(
        r["tracking"]["clicks"], 1,
        "the preview's click counted: {r}"
    );
    assert!(
        events.iter().all(|e| e["email"] != "user4@example.test"),
        "{events:?}"
    );
    // user4 is still on the list: the preview's message composes.
    env.ok(&["preview", "news", "--recipient", "user4@example.test"]);
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
