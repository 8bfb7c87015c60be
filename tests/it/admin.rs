//! The admin listener over real HTTP against real beanstalkd, SMTP peer and
//! databases: the JSON control API does what the CLI does (also the
//! resume's kick of delayed jobs), browser sessions need the CSRF token, an
//! open (token-less) listener refuses rebound host names and bare POSTs,
//! and `/metrics`, read by Python's Prometheus and OpenMetrics parsers,
//! equals `status --json` at the same moment.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;
use serde_json::Value;

pub(crate) const TOKEN: &str = "admin-t0ken-for-tests";

fn with_bearer() -> Vec<(&'static str, &'static str)> {
    vec![("Authorization", "Bearer admin-t0ken-for-tests")]
}

fn paused(env: &Env, name: &str) -> bool {
    mailsplit::store::campaigns::find(&mut env.conn(), name)
        .unwrap()
        .paused
}

fn state(env: &Env, name: &str) -> String {
    mailsplit::store::campaigns::find(&mut env.conn(), name)
        .unwrap()
        .state
        .to_string()
}

fn json(r: &Http) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

fn api_controls_campaigns(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.campaign("news", 500);
    let s = env.serve(Some(TOKEN));
    let auth = with_bearer();
    let post = |path: &str| http("POST", s.admin, path, &auth, None);

    // GET never changes anything; a wrong token changes nothing either.
    assert_eq!(
        http("GET", s.admin, "/api/campaigns/news/pause", &auth, None).status,
        405
    );
    let wrong = http(
        "POST",
        s.admin,
        "/api/campaigns/news/pause",
        &[("Authorization", "Bearer admin-t0ken-for-tesTs")],
        None,
    );
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert!(!paused(&env, "news"));

    let r = post("/api/campaigns/news/pause");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["campaign"]["state"], "paused");
    assert!(paused(&env, "news"), "the database flag is set");
    let again = post("/api/campaigns/news/pause");
    assert_eq!(again.status, 409);
    assert!(json(&again)["error"]
        .as_str()
        .unwrap()
        .contains("already paused"));

    // What paused workers do: every job goes back with a long delay.
    let mut c = bs.client();
    c.watch(&env.tube).unwrap();
    c.ignore("default").unwrap();
    for _ in 0..5 {
        let mut job = c.reserve_with_timeout(Duration::from_secs(5)).unwrap();
        job.release(100, Duration::from_secs(3600)).unwrap();
    }
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-delayed"), 5);

    let r = post("/api/campaigns/news/resume");
    assert_eq!(r.status, 200, "{}", r.body);
    let body = json(&r);
    assert_eq!(body["campaign"]["state"], "sending");
    assert_eq!(body["kicked"][0]["server"], bs.addr());
    assert_eq!(body["kicked"][0]["kicked"], 5, "{body}");
    assert!(!paused(&env, "news"));
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-delayed"), 0);
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-ready"), 5);

    // The list is `status --json`, object for object.
    let list = json(&http("GET", s.admin, "/api/campaigns", &auth, None));
    assert_eq!(list[0], env.status("news"));

    let r = post("/api/campaigns/news/cancel");
    assert_eq!(json(&r)["campaign"]["state"], "cancelled");
    assert_eq!(state(&env, "news"), "cancelled");
    for (path, code) in [
        ("/api/campaigns/news/resume", 409),
        ("/api/campaigns/news/pause", 409),
        ("/api/campaigns/news/cancel", 409),
        ("/api/campaigns/nope/pause", 404),
        ("/api/campaigns/news/delete", 404),
    ] {
        let r = post(path);
        assert_eq!(r.status, code, "{path}: {}", r.body);
        assert!(json(&r)["error"].is_string(), "{path}: {}", r.body);
    }
}

/// The CSRF token in a rendered page.
pub(crate) fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..].split('"').next().unwrap().to_string()
}

/// Log in with the form; returns the `Cookie` header value.
pub(crate) fn login(port: u16) -> String {
    let r = http("POST", port, "/login", &[], Some(&format!("token={TOKEN}")));
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/"));
    let cookie = r.header("set-cookie").expect("a session cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(
        !cookie.contains(TOKEN),
        "the cookie must not hold the token"
    );
    cookie.split(';').next().unwrap().to_string()
}

#[test]
fn browser_sessions_need_the_csrf_token_on_every_post() {
    // Enqueued (a draft cannot be paused), with no worker to send it.
    let env = World::new(Kind::Sqlite);
    env.campaign("news", 3);
    let s = env.serve(Some(TOKEN));
    let html = [("Accept", "text/html")];

    // No session: the login form, and nothing about the campaigns.
    let r = http("GET", s.admin, "/", &html, None);
    assert_eq!(r.status, 401);
    assert!(r.body.contains("name=\"token\""), "{}", r.body);
    assert!(!r.body.contains("news"));
    assert_eq!(http("GET", s.admin, "/live", &[], None).status, 401);
    assert_eq!(http("GET", s.admin, "/metrics", &[], None).status, 401);
    let wrong = http("POST", s.admin, "/login", &[], Some("token=nope"));
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(wrong.body.contains("not the admin token"));

    let cookie = login(s.admin);
    let with_cookie = [("Cookie", cookie.as_str())];
    let page = http("GET", s.admin, "/", &with_cookie, None);
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("data-campaign=\"news\""),
        "{}",
        page.body
    );
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert!(page
        .header("content-security-policy")
        .unwrap()
        .contains("frame-ancestors 'none'"));
    let csrf = csrf_of(&page.body);

    // A second session has its own token.
    let other = login(s.admin);
    let other_csrf = csrf_of(&http("GET", s.admin, "/", &[("Cookie", other.as_str())], None).body);
    assert_ne!(csrf, other_csrf);

    let pause = |headers: &[(&str, &str)], body: Option<&str>| {
        http("POST", s.admin, "/campaigns/news/pause", headers, body)
    };
    for (what, headers, body) in [
        ("no token", vec![("Cookie", cookie.as_str())], None),
        (
            "empty form",
            vec![("Cookie", cookie.as_str())],
            Some("x=1".to_string()),
        ),
        (
            "wrong token",
            vec![("Cookie", cookie.as_str())],
            Some("csrf=AAAAAAAAAAAAAAAAAAAAAAAA".into()),
        ),
        (
            "another session's token",
            vec![("Cookie", cookie.as_str())],
            Some(format!("csrf={other_csrf}")),
        ),
        (
            "cross-site",
            vec![
                ("Cookie", cookie.as_str()),
                ("Sec-Fetch-Site", "cross-site"),
            ],
            Some(format!("csrf={csrf}")),
        ),
        (
            "json body",
            vec![
                ("Cookie", cookie.as_str()),
                ("Content-Type", "application/json"),
            ],
            Some(format!("{{\"csrf\":\"{csrf}\"}}")),
        ),
    ] {
        let r = pause(&headers, body.as_deref());
        assert_eq!(r.status, 403, "{what}: {}", r.body);
        assert!(!paused(&env, "news"), "{what} paused the campaign");
    }
    // No session at all, even with a valid-looking token.
    assert_eq!(pause(&[], Some(&format!("csrf={csrf}"))).status, 401);
    // A forged or altered cookie is no session.
    let forged = format!("{}x", cookie);
    assert_eq!(
        http(
            "GET",
            s.admin,
            "/api/campaigns",
            &[("Cookie", forged.as_str())],
            None
        )
        .status,
        401
    );
    let far_future = cookie.replacen("mailsplit_admin=1", "mailsplit_admin=9", 1);
    assert_eq!(
        http(
            "GET",
            s.admin,
            "/api/campaigns",
            &[("Cookie", far_future.as_str())],
            None
        )
        .status,
        401
    );

    // The page's own form: done, and back to the page.
    let r = pause(&with_cookie, Some(&format!("csrf={csrf}")));
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/"));
    assert!(paused(&env, "news"));
    // A refusal is a page with the reason.
    let r = pause(&with_cookie, Some(&format!("csrf={csrf}")));
    assert_eq!(r.status, 409);
    assert!(r.body.contains("already paused"), "{}", r.body);

    // Scripts of the page use the header instead of a form field.
    let r = http(
        "POST",
        s.admin,
        "/api/campaigns/news/resume",
        &[("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str())],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!paused(&env, "news"));

    let out = http(
        "POST",
        s.admin,
        "/logout",
        &with_cookie,
        Some(&format!("csrf={csrf}")),
    );
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
}

/// `GET /api/campaigns` with a session cookie: its status.
fn api_status(port: u16, cookie: &str) -> u16 {
    http("GET", port, "/api/campaigns", &[("Cookie", cookie)], None).status
}

/// Logging out ends the session on the server: a copy of its cookie kept
/// from before gets 401 (the login form, for a page), while another
/// session stays open; a restart of `serve` keeps open sessions open.
fn a_logged_out_cookie_lets_nobody_in(kind: Kind) {
    let env = World::new(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let kept = login(s.admin);
    let other = login(s.admin);
    assert_eq!(api_status(s.admin, &kept), 200);
    let page = http("GET", s.admin, "/", &[("Cookie", kept.as_str())], None);
    let csrf = csrf_of(&page.body);
    let out = http(
        "POST",
        s.admin,
        "/logout",
        &[("Cookie", kept.as_str())],
        Some(&format!("csrf={csrf}")),
    );
    assert_eq!(out.status, 303, "{}", out.body);
    assert_eq!(api_status(s.admin, &kept), 401);
    let html = [("Cookie", kept.as_str()), ("Accept", "text/html")];
    let r = http("GET", s.admin, "/", &html, None);
    assert_eq!(r.status, 401);
    assert!(r.body.contains("name=\"token\""), "{}", r.body);
    assert_eq!(api_status(s.admin, &other), 200);
    // Open sessions outlive a restart; the ended one stays ended.
    drop(s);
    let s = env.serve(Some(TOKEN));
    assert_eq!(api_status(s.admin, &other), 200);
    assert_eq!(api_status(s.admin, &kept), 401);
}

both!(
    a_logged_out_cookie_lets_nobody_in,
    api_pause_resume_cancel_do_what_the_cli_does = |kind| api_controls_campaigns(kind),
);

/// A new MAILSPLIT_ADMIN_TOKEN ends every session of the old one, also if
/// the old token is set again later.
#[test]
fn a_new_admin_token_ends_every_session() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let cookie = login(s.admin);
    assert_eq!(api_status(s.admin, &cookie), 200);
    drop(s);
    let s = env.serve(Some("another-admin-t0ken-for-tests"));
    assert_eq!(api_status(s.admin, &cookie), 401);
    drop(s);
    let s = env.serve(Some(TOKEN));
    assert_eq!(api_status(s.admin, &cookie), 401);
    let fresh = login(s.admin);
    assert_eq!(api_status(s.admin, &fresh), 200);
}

#[test]
fn an_open_admin_listener_refuses_rebound_names_and_bare_posts() {
    // Enqueued (a draft cannot be paused), with no worker to send it.
    let env = World::new(Kind::Sqlite);
    env.campaign("news", 3);
    let s = env.serve(None);
    // A page of evil.example whose name was rebound to 127.0.0.1.
    let evil = http(
        "GET",
        s.admin,
        "/api/campaigns",
        &[("Host", "evil.example")],
        None,
    );
    assert_eq!(evil.status, 403, "{}", evil.body);
    let host = format!("localhost:{}", s.admin);
    assert_eq!(
        http(
            "GET",
            s.admin,
            "/api/campaigns",
            &[("Host", host.as_str())],
            None
        )
        .status,
        200
    );
    // A bare POST is what any web page can make: refused.
    let bare = http(
        "POST",
        s.admin,
        "/api/campaigns/news/pause",
        &[],
        Some("a=b"),
    );
    assert_eq!(bare.status, 403, "{}", bare.body);
    assert!(!paused(&env, "news"));
    // A script that sets the header is no cross-site form.
    let r = http(
        "POST",
        s.admin,
        "/api/campaigns/news/pause",
        &[("Authorization", "Bearer anything")],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(paused(&env, "news"));
    // The page's form token works too; /login has nothing to ask.
    let page = http("GET", s.admin, "/", &[], None);
    let csrf = csrf_of(&page.body);
    let r = http(
        "POST",
        s.admin,
        "/campaigns/news/resume",
        &[],
        Some(&format!("csrf={csrf}")),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(!paused(&env, "news"));
    assert_eq!(http("GET", s.admin, "/login", &[], None).status, 303);

    // A name with a slash, spaces, quotes and markup: escaped in the page,
    // and its button's action names exactly that campaign.
    let odd = "spring/2025 \"<b>x</b>\" & more";
    env.create_campaign(odd, "news", &[]);
    env.ok(&["enqueue", odd]);
    let page = http("GET", s.admin, "/", &[], None).body;
    assert!(!page.contains("<b>x</b>"), "markup in a name is escaped");
    let action = page
        .split("action=\"")
        .map(|a| a.split('"').next().unwrap())
        .find(|a| a.starts_with("/campaigns/spring") && a.ends_with("/pause"))
        .expect("a pause button for the odd campaign")
        .to_string();
    let r = http("POST", s.admin, &action, &[], Some(&format!("csrf={csrf}")));
    assert_eq!(r.status, 303, "{action}: {}", r.body);
    assert!(paused(&env, odd));
    assert!(!paused(&env, "news"));
}

/// Every sample of an exposition, as read by Python's `prometheus_client`
/// text parser and by its OpenMetrics parser (which must agree).
fn parse_metrics(text: &str) -> Vec<(String, serde_json::Map<String, Value>, f64)> {
    const SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families as prometheus
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
text = sys.stdin.read()
def samples(parse):
    return sorted(([s.name, s.labels, float(s.value)] for f in parse(text) for s in f.samples), key=json.dumps)
print(json.dumps({"prometheus": samples(prometheus), "openmetrics": samples(openmetrics)}))
"#;
    // Debian's python3-prometheus-client (scripts/install-deps.sh).
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 is missing: run scripts/install-deps.sh");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parsers refused it: {}\n{text}",
        stderr(&out)
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        parsed["prometheus"], parsed["openmetrics"],
        "the parsers disagree"
    );
    parsed["prometheus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s[0].as_str().unwrap().to_string(),
                s[1].as_object().unwrap().clone(),
                s[2].as_f64().unwrap(),
            )
        })
        .collect()
}

type Samples = Vec<(String, serde_json::Map<String, Value>, f64)>;

/// The value of the one sample named `name` whose labels include `labels`.
fn sample(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let hits: Vec<f64> = samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k) == Some(&Value::from(*v)))
        })
        .map(|(_, _, v)| *v)
        .collect();
    assert_eq!(hits.len(), 1, "{name} {labels:?} in {samples:?}");
    hits[0]
}

/// `/metrics` and `status --json`, one right after the other: the figures
/// per campaign must be the same.
fn assert_metrics_equal_status(env: &Env, port: u16, names: &[&str]) -> Samples {
    let r = http("GET", port, "/metrics", &with_bearer(), None);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let samples = parse_metrics(&r.body);
    for &name in names {
        let st = env.status(name);
        let c = [("campaign", name)];
        let n = |key: &str| st[key].as_i64().unwrap() as f64;
        assert_eq!(
            sample(&samples, "mailsplit_recipients", &c),
            n("recipients"),
            "{name}"
        );
        assert_eq!(
            sample(&samples, "mailsplit_messages_pending", &c),
            n("pending"),
            "{name}"
        );
        assert_eq!(
            sample(&samples, "mailsplit_enqueued_total", &c),
            n("enqueued"),
            "{name}"
        );
        for counter in ["bounced", "complaints"] {
            assert_eq!(
                sample(&samples, &format!("mailsplit_{counter}_total"), &c),
                n(counter),
                "{name} {counter}"
            );
        }
        for outcome in ["sent", "failed", "skipped"] {
            assert_eq!(
                sample(
                    &samples,
                    "mailsplit_messages_total",
                    &[("campaign", name), ("outcome", outcome)]
                ),
                n(outcome),
                "{name} {outcome}"
            );
        }
        let current = st["state"].as_str().unwrap();
        for phase in [
            "draft",
            "enqueuing",
            "sending",
            "paused",
            "done",
            "cancelled",
        ] {
            let want = if phase == current { 1.0 } else { 0.0 };
            assert_eq!(
                sample(
                    &samples,
                    "mailsplit_campaign_state",
                    &[("campaign", name), ("state", phase)]
                ),
                want,
                "{name} {phase}"
            );
        }
    }
    samples
}

#[test]
fn metrics_parse_as_prometheus_text_and_equal_status_json() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        // About one in ten refused: failures to count, far from auto-pause.
        reject_every: Some(10),
        data_delay: Duration::from_millis(20),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    // 400 recipients, every tenth unsubscribed (skipped at enqueue).
    let csv = env.dir.path().join("people.csv");
    let mut text = String::from("email,name,status\n");
    for i in 1..=400 {
        let status = if i % 10 == 0 {
            "unsubscribed"
        } else {
            "active"
        };
        text.push_str(&format!("user{i}@example.test,User {i},{status}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    env.create_campaign("news", "people", &[]);
    // A name that needs escaping in a label value, never enqueued.
    let odd = "odd \"name\" \\ λ,{x=1}";
    env.create_campaign(odd, "people", &[]);
    env.ok(&["enqueue", "news"]);
    env.ok(&["rate", "set", "domain:example.test", "300/s"]);
    let s = env.serve(Some(TOKEN));
    let _worker = env.worker(&["--concurrency", "4"]);
    wait_for(60, "some mail to go out", || {
        env.status("news")["sent"].as_i64().unwrap() >= 60
    });

    // Mid-run: pause, let the messages in flight land, then compare.
    let r = http(
        "POST",
        s.admin,
        "/api/campaigns/news/pause",
        &with_bearer(),
        None,
    );
    assert_eq!(r.status, 200);
    let mut last = -1;
    wait_for(30, "the paused campaign to settle", || {
        let now = env.status("news")["sent"].as_i64().unwrap();
        let settled = now == last;
        last = now;
        std::thread::sleep(Duration::from_millis(700));
        settled
    });
    let status = env.status("news");
    assert!(
        status["pending"].as_i64().unwrap() > 0,
        "finished before the pause: {status}"
    );
    // A worker's first beat waits for the hash of its binary.
    wait_for(30, "the worker's first heartbeat", || {
        !env.workers().is_empty()
    });
    let samples = assert_metrics_equal_status(&env, s.admin, &["news", odd]);
    assert_eq!(
        sample(&samples, "mailsplit_workers", &[("state", "running")]),
        1.0
    );
    assert_eq!(
        sample(&samples, "mailsplit_workers", &[("state", "lost")]),
        0.0
    );
    assert_eq!(
        sample(&samples, "mailsplit_workers_on_newest_binary", &[]),
        1.0
    );
    let group = [("group", "domain:example.test")];
    assert_eq!(
        sample(&samples, "mailsplit_rate_group_limit", &group),
        300.0
    );
    assert!(sample(&samples, "mailsplit_rate_group_granted_total", &group) >= 60.0);
    let server = bs.addr();
    assert_eq!(
        sample(&samples, "mailsplit_queue_up", &[("server", &server)]),
        1.0
    );

    // Resume and finish: compare again, and the tube's counts.
    let r = http(
        "POST",
        s.admin,
        "/api/campaigns/news/resume",
        &with_bearer(),
        None,
    );
    assert_eq!(r.status, 200);
    wait_done(&env, "news", 120);
    let samples = assert_metrics_equal_status(&env, s.admin, &["news", odd]);
    let status = env.status("news");
    assert_eq!(status["state"], "done");
    assert_eq!(status["skipped"], 40);
    assert!(status["failed"].as_i64().unwrap() > 0);
    // The peer's 550 5.1.1 is a hard bounce at send time.
    assert!(status["bounced"].as_i64().unwrap() > 0, "{status}");
    assert_eq!(peer.total() as i64, status["sent"].as_i64().unwrap());
    for state in ["ready", "reserved", "delayed", "buried"] {
        let want = bs.tube_stat(&env.tube, &format!("current-jobs-{state}")) as f64;
        assert_eq!(
            sample(
                &samples,
                "mailsplit_queue_jobs",
                &[("server", &server), ("state", state)]
            ),
            want,
            "{state}"
        );
    }
}
