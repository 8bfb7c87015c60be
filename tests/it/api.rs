//! `/api/v1` over real HTTP against a real `serve`, beanstalkd, worker,
//! SMTP peer and both databases: keys and scopes (401/403, revoke at the
//! next request, the failed-attempt limiter that never locks out the right
//! key), problem+json on every error kind, the per-key rate limit, and
//! the OpenAPI document checked by a validator and a fuzzer. What the
//! routes do end to end is in `api_flows`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::util::*;
use serde_json::{json, Value};

pub(crate) const TOKEN: &str = "admin-t0ken-for-api-tests";

/// `serve` with its log in a file (the helper's goes to /dev/null).
pub(crate) fn serve_logged(env: &Env, vars: &[(&str, &str)]) -> (Served, PathBuf) {
    let (public, admin) = (free_port(), free_port());
    let log = env.dir.path().join("serve.log");
    let mut cmd = env.cmd(&[
        "serve",
        "--listen",
        &format!("127.0.0.1:{public}"),
        "--admin-listen",
        &format!("127.0.0.1:{admin}"),
    ]);
    cmd.env("MAILSPLIT_ADMIN_TOKEN", TOKEN)
        .envs(vars.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let proc = Proc(cmd.spawn().unwrap());
    wait_port(public);
    wait_port(admin);
    let served = Served {
        proc,
        public,
        admin,
    };
    (served, log)
}

/// `apikey create NAME --scopes SCOPES`: the key it printed.
pub(crate) fn key(env: &Env, name: &str, scopes: &str) -> String {
    let out = env.ok(&["apikey", "create", name, "--scopes", scopes]);
    let key = out.lines().last().unwrap().trim().to_string();
    assert!(key.starts_with("ms_") && key.len() >= 40, "{out}");
    key
}

pub(crate) fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

pub(crate) fn call(port: u16, method: &str, path: &str, key: &str, body: Option<&Value>) -> Http {
    let auth = bearer(key);
    let mut headers = vec![("Authorization", auth.as_str())];
    let text = body.map(|b| b.to_string());
    if text.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    http(method, port, path, &headers, text.as_deref())
}

pub(crate) fn json_of(r: &Http) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {} {}", r.status, r.body))
}

/// An RFC 9457 problem with this status, whose detail never holds `secret`.
pub(crate) fn assert_problem(r: &Http, status: u16, secret: &str) -> Value {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{status}: {:?}",
        r.headers
    );
    let p = json_of(r);
    assert_eq!(p["status"], status, "{p}");
    assert!(p["type"].is_string() && p["title"].is_string(), "{p}");
    assert!(!p["detail"].as_str().unwrap().is_empty(), "{p}");
    assert!(!r.body.contains(secret), "{status} echoes a secret: {p}");
    p
}

/// Keys appear nowhere but in `create`'s output: not in `apikey ls`
/// (plain or JSON), not in `serve`'s log.
fn assert_no_key_shown(env: &Env, log: &std::path::Path, keys: &[&str]) {
    // Keys appear nowhere but in `create`'s output.
    let ls = env.ok(&["apikey", "ls"]) + &env.ok(&["apikey", "ls", "--json"]);
    assert!(ls.contains("reader") && !ls.contains("shop"), "{ls}");
    assert!(
        ls.contains("last used 20"),
        "the reader's use is recorded: {ls}"
    );
    for line in env.ok(&["apikey", "ls", "--json"]).lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["scopes"], json!(["read"]));
    }
    let logged = std::fs::read_to_string(log).unwrap();
    assert!(logged.contains("api key: wrong token"), "{logged}");
    for secret in keys.iter().copied().chain([TOKEN]) {
        assert!(!ls.contains(secret), "apikey ls shows a key");
        assert!(!logged.contains(secret), "the log holds a key:\n{logged}");
    }
}

fn keys_scopes_revoke_and_lockout(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.ok(&["migrate"]);
    let reader = key(&env, "reader", "read");
    let writer = key(&env, "shop", "subscribers");
    let (s, log) = serve_logged(&env, &[]);
    let sub = json!({"email": "ada@example.test", "lists": ["news"]});
    let list = |k: &str| call(s.admin, "GET", "/api/v1/campaigns", k, None);
    let add = |k: &str| call(s.admin, "POST", "/api/v1/subscribers", k, Some(&sub));

    assert_problem(
        &http("GET", s.admin, "/api/v1/campaigns", &[], None),
        401,
        TOKEN,
    );
    let forged = format!("{}x", &writer[..writer.len() - 1]);
    assert_problem(&list(&forged), 401, &forged);
    // A key without the scope: 403, whatever the body (checked first).
    assert_problem(&add(&reader), 403, &reader);
    let headers = [
        ("Authorization", bearer(&reader)),
        ("Content-Type", "application/json".into()),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = http(
        "POST",
        s.admin,
        "/api/v1/subscribers",
        &headers,
        Some("{not json"),
    );
    assert_problem(&r, 403, &reader);
    // `subscribers` does not imply `read`; the admin token holds every scope.
    assert_problem(&list(&writer), 403, &writer);
    assert_eq!((list(&reader).status, add(&writer).status), (200, 201));
    // A key is no admin token: the dashboard's routes refuse it.
    assert_eq!(
        call(s.admin, "GET", "/api/campaigns", &reader, None).status,
        401
    );
    let r = call(
        s.admin,
        "GET",
        "/api/v1/subscribers/ada@example.test",
        TOKEN,
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // Revoked: refused from the very next request.
    env.ok(&["apikey", "revoke", "shop"]);
    assert_problem(&add(&writer), 401, &writer);
    assert_eq!(
        env.run(&["apikey", "revoke", "shop"]).status.code(),
        Some(2)
    );

    // Wrong keys from one address: 429 with Retry-After once the limiter's
    // count is used up, but the right key still gets in.
    let mut tries: Vec<Http> = (0..12).map(|i| list(&format!("ms_guess{i}"))).collect();
    let last = tries.pop().unwrap();
    assert_problem(&last, 429, "ms_guess");
    assert!(last.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(list(&reader).status, 200);

    drop(s);
    assert_no_key_shown(&env, &log, &[&reader, &writer, &forged]);
    let stored = mailsplit::store::api_keys::list(&mut env.conn()).unwrap();
    assert_eq!(stored.len(), 1);
}

/// POST `body` with curl, which waits for `100 Continue` before a large
/// body, as HTTP clients do, so an early 413 arrives whole (ureq would
/// write the body into a connection the server already answered and
/// closed).
fn post_with_curl(port: u16, auth: &str, body: &str) -> Http {
    let dir = tempfile::tempdir().unwrap();
    let (file, out) = (dir.path().join("body"), dir.path().join("out"));
    std::fs::write(&file, body).unwrap();
    let done = std::process::Command::new("curl")
        .args([
            "-sS",
            "-o",
            out.to_str().unwrap(),
            "-w",
            "%{http_code} %{content_type}",
        ])
        .args([
            "-H",
            &format!("Authorization: {auth}"),
            "-H",
            "Content-Type: application/json",
        ])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://127.0.0.1:{port}/api/v1/subscribers"))
        .output()
        .unwrap();
    let written = String::from_utf8_lossy(&done.stdout).into_owned();
    let (status, content_type) = written.split_once(' ').unwrap();
    Http {
        status: status.parse().unwrap(),
        headers: vec![("content-type".into(), content_type.into())],
        body: std::fs::read_to_string(out).unwrap_or_default(),
    }
}

fn subscriber_errors_are_problems(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.import_n("news", 3);
    let k = key(&env, "all", "subscribers,campaigns,read");
    let (s, _log) = serve_logged(&env, &[]);
    let auth = bearer(&k);
    let post_as = |content_type: &str, body: &str| {
        let headers = [
            ("Authorization", auth.as_str()),
            ("Content-Type", content_type),
        ];
        http("POST", s.admin, "/api/v1/subscribers", &headers, Some(body))
    };
    // 2 MiB: refused before it is read.
    let big = format!(
        r#"{{"email":"a@b.test","lists":["x"],"name":"{}"}}"#,
        "x".repeat(2 << 20)
    );
    let cases = [
        (r#"{"email":"#, 400),
        (r#"{"email":5,"lists":[]}"#, 400),
        (r#"{"email":"not an address","lists":["x"]}"#, 400),
        (r#"{"email":"a@b.test","lists":[]}"#, 400),
        (
            r#"{"email":"a@b.test","lists":["x"],"double_opt_in":true}"#,
            422,
        ),
    ];
    for (body, status) in cases {
        assert_problem(&post_as("application/json", body), status, &k);
    }
    assert_problem(&post_as("text/plain", "{}"), 415, &k);
    assert_problem(&post_with_curl(s.admin, &auth, &big), 413, &k);
    let unknown = r#"{"email":"a@b.test","lists":["x"],"password":"hunter2"}"#;
    let p = assert_problem(&post_as("application/json", unknown), 400, "hunter2");
    assert!(p["detail"].as_str().unwrap().contains("password"), "{p}");
    for (method, path, status) in [
        ("GET", "/api/v1/subscribers/nobody@example.test", 404),
        ("GET", "/api/v1/nothing/here", 404),
        ("PUT", "/api/v1/campaigns", 405),
    ] {
        assert_problem(&call(s.admin, method, path, &k, None), status, &k);
    }
    // Nothing refused wrote anything: list "x" was never made.
    assert!(mailsplit::store::recipients::find_list(&mut env.conn(), "x").is_err());
}

fn campaign_errors_are_problems(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.import_n("news", 3);
    let k = key(&env, "all", "subscribers,campaigns,read");
    let (s, _log) = serve_logged(&env, &[]);
    let create = |name: &str, change: (&str, &str)| {
        let mut body = json!({"name": name, "list": "news", "subject": "Hi",
            "from": "Shop <shop@example.test>", "html": "<p>Hi {{ name }}</p>"});
        body[change.0] = json!(change.1);
        call(s.admin, "POST", "/api/v1/campaigns", &k, Some(&body))
    };
    let r = create("w1", ("track", "none"));
    assert_eq!(r.status, 201, "{}", r.body);
    let mut made = json_of(&r);
    let warnings = made.as_object_mut().unwrap().remove("warnings");
    assert_eq!(made, env.status("w1"));
    // What `campaign create` warns of on stderr, word for word.
    let cli = env.try_create_campaign_from("c1", "news", "Shop <shop@example.test>", &[]);
    let said: Vec<String> = stderr(&cli)
        .lines()
        .filter_map(|l| l.strip_prefix("mailsplit: warning: "))
        .map(String::from)
        .collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert_eq!(warnings, Some(json!(said)));
    let r = create("w5", ("public_url", "https://shop.example.test"));
    assert_eq!(r.status, 201, "{}", r.body);
    let w = &json_of(&r)["warnings"];
    assert_eq!(w, &json!([said[1]]), "{w}");
    assert_problem(&create("w1", ("track", "none")), 409, &k);
    let bad = create("w2", ("html", "<p>ok</p>\n<p>{% if %}</p>"));
    let p = assert_problem(&bad, 422, &k);
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("html:2:") && !detail.contains("mailsplit-api-"),
        "{p}"
    );
    assert_problem(&create("w3", ("list", "nope")), 422, &k);
    assert_problem(&create("w4", ("markdown", "# two contents")), 400, &k);
    for (method, path, status) in [
        ("GET", "/api/v1/campaigns/nope", 404),
        ("POST", "/api/v1/campaigns/w1/resume", 409),
        ("POST", "/api/v1/campaigns/w1/explode", 404),
        ("POST", "/api/v1/campaigns/nope/enqueue", 404),
    ] {
        assert_problem(&call(s.admin, method, path, &k, None), status, &k);
    }
    let list = env.ok(&["campaign", "list"]);
    assert!(
        ["w2", "w3", "w4"].iter().all(|w| !list.contains(w)),
        "{list}"
    );
}

fn rate_limit_per_key(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.ok(&["migrate"]);
    let a = key(&env, "a", "read");
    let b = key(&env, "b", "read");
    let (s, _log) = serve_logged(
        &env,
        &[("MAILSPLIT_API_RATE", "1"), ("MAILSPLIT_API_BURST", "3")],
    );
    for _ in 0..3 {
        assert_eq!(
            call(s.admin, "GET", "/api/v1/campaigns", &a, None).status,
            200
        );
    }
    let r = call(s.admin, "GET", "/api/v1/campaigns", &a, None);
    assert_problem(&r, 429, &a);
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    // Another key has a bucket of its own.
    assert_eq!(
        call(s.admin, "GET", "/api/v1/campaigns", &b, None).status,
        200
    );
    std::thread::sleep(Duration::from_secs(wait));
    assert_eq!(
        call(s.admin, "GET", "/api/v1/campaigns", &a, None).status,
        200
    );
}

/// `scripts/api-conformance.sh`: the OpenAPI document validates
/// (openapi-spec-validator) and schemathesis, fuzzing every route from it,
/// finds no 5xx and no response that differs from the document.
#[test]
fn openapi_document_validates_and_the_fuzzer_finds_nothing() {
    let out = std::process::Command::new("scripts/api-conformance.sh")
        .arg(BIN)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("BEANSTALKD")
        .output()
        .unwrap();
    let shown = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("openapi.json: OK"), "{shown}");
    assert!(shown.contains("found nothing"), "{shown}");
}

both!(
    keys_scopes_revoke_and_lockout,
    subscriber_errors_are_problems,
    campaign_errors_are_problems,
    rate_limit_per_key,
);
