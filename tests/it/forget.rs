//! `subscriber forget` and `DELETE /api/v1/subscribers/{email}` (issue 38
//! item 5): after it, a dump of the whole database (SQLite: the raw
//! files; PostgreSQL: `pg_dump`) holds neither the address nor the name,
//! `report` says the same, and nothing but a confirmed double-opt-in
//! brings the address back. Against the real binary, beanstalkd, the
//! scripted SMTP peer, SQLite and PostgreSQL.

use mailsplit::store::engagement::{self, Hit, HitKind};
use mailsplit::store::messages::MessageStatus;
use serde_json::json;

use crate::api::{assert_problem, call, key, serve_logged};
use crate::messages_tx::{send, templates, wait_status};
use crate::util::*;

/// Distinctive: found in a dump only if something kept them.
const ADDR: &str = "zq.ada.lovelace7@example.org";
const LOCAL: &str = "zq.ada.lovelace7";
const NAME: &str = "Augusta Quillfeather";
const PUBLIC_URL: &str = "http://127.0.0.1:9";

/// Everything the database holds, as lower-case text: the SQLite files'
/// raw bytes (free pages and the write-ahead log included), or `pg_dump`.
pub(crate) fn dump(env: &Env) -> String {
    let url = &env.db.url;
    let bytes = if let Some(path) = url.strip_prefix("sqlite://") {
        let mut all = Vec::new();
        for suffix in ["", "-wal", "-shm", "-journal"] {
            if let Ok(b) = std::fs::read(format!("{path}{suffix}")) {
                all.extend(b);
            }
        }
        all
    } else {
        let out = std::process::Command::new("pg_dump")
            .arg(url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    String::from_utf8_lossy(&bytes).to_ascii_lowercase()
}

fn traces(env: &Env) -> Vec<&'static str> {
    let d = dump(env);
    [LOCAL, "quillfeather"]
        .into_iter()
        .filter(|s| d.contains(s))
        .collect()
}

fn confirm_template(env: &Env) {
    let html = env.dir.path().join("confirm.html");
    std::fs::write(&html, "<p><a href=\"{{ data.confirm_url }}\">yes</a></p>\n").unwrap();
    env.ok(&[
        "template",
        "create",
        "confirm",
        "--subject",
        "Please confirm",
        "--from",
        "shop@example.test",
        "--html",
        html.to_str().unwrap(),
    ]);
}

/// The path of the newest confirmation link sent.
fn last_confirm_path(env: &Env) -> String {
    let mut conn = env.conn();
    let mut path = None;
    for id in 1..200 {
        let Some(m) = mailsplit::store::messages::find(&mut conn, id).unwrap() else {
            continue;
        };
        let data: serde_json::Value = serde_json::from_str(&m.data).unwrap();
        if let Some(url) = data["confirm_url"].as_str() {
            path = Some(url.strip_prefix(PUBLIC_URL).unwrap().to_string());
        }
    }
    path.expect("no confirmation mail")
}

fn received(peer: &ScriptedSmtp, addr: &str) -> usize {
    peer.received
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(addr))
        .map(|(_, n)| *n as usize)
        .sum()
}

fn campaign_id(env: &Env, name: &str) -> i64 {
    mailsplit::store::campaigns::find(&mut env.conn(), name)
        .unwrap()
        .id
}

/// The figures of `status --json` that never move once a campaign is done.
fn figures(env: &Env, name: &str) -> Vec<serde_json::Value> {
    let s = env.status(name);
    [
        "recipients",
        "sent",
        "failed",
        "skipped",
        "bounced",
        "complaints",
        "opened",
        "clicked",
        "unsubscribed",
    ]
    .iter()
    .map(|k| s[*k].clone())
    .collect()
}

/// The person everywhere: 2 lists, a sent campaign with an open and a
/// click (on a link carrying the address), a bounce report quoting them,
/// a transactional message, a sign-up waiting for its confirmation.
fn everywhere(env: &Env, peer: &ScriptedSmtp) {
    templates(env);
    confirm_template(env);
    env.ok(&["list", "create", "weekly", "--public", "--double-opt-in"]);
    let csv = env.dir.path().join("people.csv");
    std::fs::write(
        &csv,
        format!("email,name,city\nZQ.Ada.Lovelace7@Example.org,{NAME},Quillfeatherton\nbob@example.org,Bob,Leeds\n"),
    )
    .unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "news"]);
    env.ok(&["import", csv.to_str().unwrap(), "--list", "vip"]);
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let (mid, _) = send(
        env,
        "order",
        &format!("{NAME} <{ADDR}>"),
        &["--data", r#"{"order_id":"Q-1","total":"for Quillfeather"}"#],
    );
    let w = env.worker(&[]);
    wait_done(env, "news", 60);
    wait_status(env, mid, MessageStatus::Sent, 30);
    let cid = campaign_id(env, "news");
    let rid: i64 = mailsplit::store::subscribers::find(&mut env.conn(), ADDR)
        .unwrap()
        .unwrap()
        .id;
    let url = format!("https://shop.example/p?u={}", ADDR.replace('@', "%40"));
    let hit = |kind| Hit {
        campaign: cid,
        recipient: rid,
        version: 1,
        kind,
        at: 1,
        proxy: false,
    };
    engagement::record_batch(
        &mut env.conn(),
        &[hit(HitKind::Open), hit(HitKind::TemplateLink(url.into()))],
    )
    .unwrap();
    env.sql(&format!(
        "INSERT INTO bounces (recipient_id, campaign_id, email, kind, status, reason, source, fingerprint, received_at) \
         VALUES ({rid}, {cid}, '{ADDR}', 'hard', '5.1.1', '<{ADDR}>: mailbox of {NAME} unknown', 'dsn', 'fp-1', 1)"
    ));
    let (s, _log) = serve_logged(env, &[("MAILSPLIT_PUBLIC_URL", PUBLIC_URL)]);
    let form = format!(
        "email={}&name=Augusta+Quillfeather&list=weekly",
        ADDR.replace('@', "%40")
    );
    assert_eq!(
        http("POST", s.public, "/subscribe", &[], Some(&form)).status,
        200
    );
    drop(s);
    wait_for(30, "the confirmation mail", || received(peer, ADDR) == 3);
    stop_worker(w);
}

fn forget_leaves_no_trace(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    everywhere(&env, &peer);
    assert_eq!(traces(&env), [LOCAL, "quillfeather"], "the dump sees them");
    let report = env.ok(&["report", "news", "--json"]);
    let status = figures(&env, "news");

    // Without --yes and no terminal: refused, nothing erased.
    let out = env.run(&["subscriber", "forget", ADDR]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert_eq!(traces(&env).len(), 2);

    let out = env.ok(&[
        "subscriber",
        "forget",
        "zq.ADA.lovelace7@EXAMPLE.org",
        "--yes",
    ]);
    assert!(
        out.contains("1 recipient rows, 2 list memberships"),
        "{out}"
    );
    assert_eq!(traces(&env), Vec::<&str>::new(), "a dump still holds them");

    // The campaign's figures are the same; texts that quoted the person
    // say `forgotten` instead.
    let after = env.ok(&["report", "news", "--json"]).to_ascii_lowercase();
    let expected = report
        .to_ascii_lowercase()
        .replace(ADDR, "forgotten@forgotten.invalid")
        .replace(&NAME.to_ascii_lowercase(), "forgotten");
    assert_eq!(after, expected);
    assert_eq!(figures(&env, "news"), status);
    let out = env.run(&["subscriber", "export", ADDR]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));

    // A re-import adds nobody at that address, and says so.
    let csv = env.dir.path().join("again.csv");
    std::fs::write(
        &csv,
        format!("email,name\n{ADDR},{NAME}\ncy@example.org,Cy\n"),
    )
    .unwrap();
    let out = env.ok(&["import", csv.to_str().unwrap(), "--list", "news", "--sync"]);
    assert!(out.contains("skipped 1 rows of addresses erased"), "{out}");
    assert!(out.contains("added 1 /"), "{out}");
    env.create_campaign("again", "news", &[]);
    env.ok(&["enqueue", "again"]);
    let w = env.worker(&[]);
    wait_done(&env, "again", 60);
    assert_eq!(received(&peer, ADDR), 3, "mailed again after forget");
    assert_eq!(received(&peer, "cy@example.org"), 1);
    assert_eq!(traces(&env), Vec::<&str>::new());

    // The API: no upsert, no message (422, nothing echoed).
    let k = key(&env, "shop", "subscribers,send,read");
    let (s, log) = serve_logged(&env, &[("MAILSPLIT_PUBLIC_URL", PUBLIC_URL)]);
    let sub = json!({"email": ADDR, "name": "Someone", "lists": ["news"]});
    let p = assert_problem(
        &call(s.admin, "POST", "/api/v1/subscribers", &k, Some(&sub)),
        422,
        LOCAL,
    );
    assert!(
        p["detail"].as_str().unwrap().contains("double-opt-in"),
        "{p}"
    );
    let msg = json!({"template": "order", "to": ADDR});
    assert_problem(
        &call(s.admin, "POST", "/api/v1/messages", &k, Some(&msg)),
        422,
        LOCAL,
    );
    assert_eq!(traces(&env), Vec::<&str>::new());

    // The person asks again and confirms: back, on that list only.
    let form = format!("email={}&name=Ada&list=weekly", ADDR.replace('@', "%40"));
    let r = http("POST", s.public, "/subscribe", &[], Some(&form));
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(r.status, 200, "{}", said());
    let path = last_confirm_path(&env);
    assert_eq!(http("POST", s.public, &path, &[], Some("")).status, 200);
    let got = call(
        s.admin,
        "GET",
        &format!("/api/v1/subscribers/{ADDR}"),
        &k,
        None,
    );
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.body.contains("\"weekly\""), "{}", got.body);
    let r = call(s.admin, "POST", "/api/v1/messages", &k, Some(&msg));
    assert_eq!(r.status, 202, "{}", r.body);
    drop(s);
    stop_worker(w);
}

/// `DELETE /api/v1/subscribers/{email}` is the same erasure: 204 (again
/// 204), the subscriber gone, the address refused afterwards; the other
/// subscriber untouched.
fn delete_through_the_api(kind: Kind) {
    let (_tmp, _bs, _peer, env) = setup(kind, Script::default());
    env.ok(&["migrate"]);
    let k = key(&env, "shop", "subscribers,read");
    let (s, _log) = serve_logged(&env, &[]);
    for (email, name) in [(ADDR, NAME), ("bob@example.org", "Bob")] {
        let sub = json!({"email": email, "name": name, "attributes": {"city": "Quillfeatherton"}, "lists": ["news"]});
        let r = call(s.admin, "POST", "/api/v1/subscribers", &k, Some(&sub));
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let path = format!("/api/v1/subscribers/{}", ADDR.to_uppercase());
    assert_eq!(call(s.admin, "DELETE", &path, &k, None).status, 204);
    assert_eq!(call(s.admin, "DELETE", &path, &k, None).status, 204);
    assert_eq!(call(s.admin, "GET", &path, &k, None).status, 404);
    let bob = call(
        s.admin,
        "GET",
        "/api/v1/subscribers/bob@example.org",
        &k,
        None,
    );
    assert!(bob.body.contains("Quillfeatherton"), "{}", bob.body);
    let sub = json!({"email": ADDR, "lists": ["news"]});
    assert_problem(
        &call(s.admin, "POST", "/api/v1/subscribers", &k, Some(&sub)),
        422,
        LOCAL,
    );
    drop(s);
    let d = dump(&env);
    assert!(
        !d.contains(LOCAL) && !d.contains("augusta"),
        "a dump still holds them"
    );
}

/// `POST /api/v1/messages` (and `send`) to a suppressed address, by
/// itself or its domain, is 422 and stores nothing; a retry of a message
/// stored before the entry gets its own answer, and the claim-time check
/// still stops it.
fn a_message_to_a_suppressed_address_is_refused(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    templates(&env);
    env.ok(&[
        "suppress",
        "add",
        "ada@example.org",
        "@blocked.example",
        "--reason",
        "zqsecret",
    ]);
    let k = key(&env, "shop", "send,read");
    let (s, _log) = serve_logged(&env, &[]);
    let post = |to: &str, idem: &str| {
        let auth = format!("Bearer {k}");
        let body = json!({"template": "order", "to": to, "data": {"order_id": "1"}}).to_string();
        let headers = [
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", idem),
        ];
        http("POST", s.admin, "/api/v1/messages", &headers, Some(&body))
    };
    for (to, idem) in [("Ada <ADA@example.org>", "a"), ("bob@Blocked.example", "b")] {
        let p = assert_problem(&post(to, idem), 422, "zqsecret");
        assert!(
            p["detail"].as_str().unwrap().contains("suppression list"),
            "{p}"
        );
    }
    let out = env.run(&["send", "order", "--to", "ada@example.org"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("suppression list"),
        "{}",
        stderr(&out)
    );
    // A subdomain is not the domain.
    assert_eq!(post("dee@sub.blocked.example", "d").status, 202);
    let eve = post("eve@example.org", "e");
    assert_eq!(eve.status, 202, "{}", eve.body);
    // Suppressed after it was stored: the retry is the same message…
    env.ok(&["suppress", "add", "eve@example.org"]);
    let again = post("eve@example.org", "e");
    assert_eq!((again.status, &again.body), (202, &eve.body));
    // …a new one is refused, and the worker's claim stops the first.
    assert_problem(&post("eve@example.org", "e2"), 422, "zqsecret");
    let id = serde_json::from_str::<serde_json::Value>(&eve.body).unwrap()["id"]
        .as_i64()
        .unwrap();
    let w = env.worker(&[]);
    wait_status(&env, id, MessageStatus::Suppressed, 30);
    wait_for(30, "dee's message", || {
        received(&peer, "dee@sub.blocked.example") == 1
    });
    stop_worker(w);
    drop(s);
    assert_eq!(
        mailsplit::store::messages::count_all(&mut env.conn()).unwrap(),
        2
    );
    assert_eq!(peer.total(), 1);
}

both!(
    forget_leaves_no_trace,
    delete_through_the_api,
    a_message_to_a_suppressed_address_is_refused,
);
