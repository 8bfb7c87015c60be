//! `mailsplit serve` over real HTTP: two listeners split by trust, the admin
//! token, graceful shutdown; one-click unsubscribe (RFC 8058) in both
//! encodings, a GET that changes nothing, tokens that are not genuine, and
//! an unsubscribe that stops a message of a running campaign.

use std::time::{Duration, Instant};

use crate::util::{
    free_port, signal, wait_done, wait_exit, wait_for, Beanstalkd, Env, Kind, Script, ScriptedSmtp,
};

/// A running `serve` with its two ports.
type Serve = crate::util::Served;

fn serve(env: &Env, token: Option<&str>) -> Serve {
    env.serve(token)
}

fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req =
        ureq::get(&format!("http://127.0.0.1:{port}{path}")).timeout(Duration::from_secs(10));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

#[test]
fn admin_routes_need_the_token_and_public_ones_do_not() {
    // A live beanstalkd: `/healthz` says 200 only when it answers.
    let (_tmp, _bs, env) = crate::util::env_with_beanstalkd(Kind::Sqlite);
    env.campaign_without_enqueue("news", 3);
    let mut s = serve(&env, Some("s3cret-token"));
    assert_eq!(get(s.public, "/healthz", None), (200, "ok\n".into()));
    // No token, a wrong one, one with a different length: refused.
    for token in [None, Some("wrong-token!"), Some("s3cret")] {
        let (code, body) = get(s.admin, "/api/campaigns", token);
        assert_eq!(code, 401, "{token:?}: {body}");
        assert!(!body.contains("news"));
    }
    let (code, body) = get(s.admin, "/api/campaigns", Some("s3cret-token"));
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list[0]["name"], "news");
    assert_eq!(list[0]["state"], "draft");
    assert_eq!(list[0]["recipients"], 3);
    // The admin routes are not on the public listener.
    assert_eq!(get(s.public, "/api/campaigns", Some("s3cret-token")).0, 404);
    signal(&s.proc.0, "TERM");
    assert!(wait_exit(&mut s.proc.0, 10).success());
}

#[test]
fn without_a_token_the_admin_listener_stays_on_loopback() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let out = env
        .cmd(&[
            "serve",
            "--admin-listen",
            &format!("0.0.0.0:{}", free_port()),
        ])
        .env_remove("MAILSPLIT_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = crate::util::stderr(&out);
    assert!(err.contains("MAILSPLIT_ADMIN_TOKEN"), "{err}");
}

/// The one-click link of a recipient, read from the message `preview`
/// composes for them (the message a worker would send).
fn unsubscribe_link(env: &Env, campaign: &str, email: &str) -> String {
    let message = env.ok(&["preview", campaign, "--recipient", email, "--real-links"]);
    assert_eq!(
        crate::util::header(&message, "List-Unsubscribe-Post"),
        ["List-Unsubscribe=One-Click"],
        "{message}"
    );
    let link = crate::util::header(&message, "List-Unsubscribe");
    assert_eq!(link.len(), 1, "{message}");
    link[0].trim_matches(['<', '>']).to_string()
}

/// A recipient's status, status reason and status time, straight from the
/// database.
fn recipient_row(env: &Env, email: &str) -> (String, Option<String>, Option<i64>) {
    use diesel::sql_types::{BigInt, Nullable, Text};
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        status: String,
        #[diesel(sql_type = Nullable<Text>)]
        status_reason: Option<String>,
        #[diesel(sql_type = Nullable<BigInt>)]
        status_at: Option<i64>,
    }
    let q = diesel::sql_query(format!(
        "SELECT status, status_reason, status_at FROM recipients WHERE email = '{email}'"
    ));
    let row: Row = match env.db.url.strip_prefix("sqlite://") {
        Some(path) => q
            .get_result(&mut diesel::SqliteConnection::establish(path).unwrap())
            .unwrap(),
        None => q
            .get_result(&mut diesel::PgConnection::establish(&env.db.url).unwrap())
            .unwrap(),
    };
    (row.status, row.status_reason, row.status_at)
}

/// The ledger state of one recipient in one campaign, if it has a row.
fn delivery_state(env: &Env, campaign: &str, email: &str) -> Option<String> {
    use diesel::sql_types::Text;
    use diesel::{Connection, OptionalExtension, QueryableByName, RunQueryDsl};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        state: String,
    }
    let q = diesel::sql_query(format!(
        "SELECT d.state FROM deliveries d JOIN campaigns c ON c.id = d.campaign_id \
         JOIN recipients r ON r.id = d.recipient_id WHERE c.name = '{campaign}' AND r.email = '{email}'"
    ));
    let row: Option<Row> = match env.db.url.strip_prefix("sqlite://") {
        Some(path) => q
            .get_result(&mut diesel::SqliteConnection::establish(path).unwrap())
            .optional()
            .unwrap(),
        None => q
            .get_result(&mut diesel::PgConnection::establish(&env.db.url).unwrap())
            .optional()
            .unwrap(),
    };
    row.map(|r| r.state)
}

/// An HTTP client that never follows a redirect (a one-click answer must
/// not be one).
fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(Duration::from_secs(10))
        .build()
}

/// Status, body and whether a cookie was set.
fn answer(result: Result<ureq::Response, ureq::Error>) -> (u16, String, bool) {
    let r = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("request failed: {e}"),
    };
    let cookie = r.header("set-cookie").is_some();
    (r.status(), r.into_string().unwrap(), cookie)
}

/// RFC 8058 §3.2: the body as application/x-www-form-urlencoded.
fn post_form(url: &str) -> (u16, String, bool) {
    answer(
        agent()
            .post(url)
            .send_form(&[("List-Unsubscribe", "One-Click")]),
    )
}

/// RFC 8058 §3.2: the body as multipart/form-data.
fn post_multipart(url: &str) -> (u16, String, bool) {
    let body = "--XyZzY\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\n\
                One-Click\r\n--XyZzY--\r\n";
    answer(
        agent()
            .post(url)
            .set("Content-Type", "multipart/form-data; boundary=XyZzY")
            .send_string(body),
    )
}

fn one_click_unsubscribe(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    env.import_n("news", 4);
    let s = serve(&env, None);
    let base = format!("http://127.0.0.1:{}", s.public);
    env.create_campaign("news", "news", &["--public-url", &base]);
    let link = |i: usize| unsubscribe_link(&env, "news", &format!("user{i}@example.test"));
    let (one, two) = (link(1), link(2));
    assert!(one.starts_with(&format!("{base}/u/")), "{one}");
    let token = one.rsplit('/').next().unwrap().to_string();
    assert!(token.len() <= 32, "{token}");

    // GET shows a page whose button POSTs, and changes nothing.
    for _ in 0..2 {
        let (code, body, cookie) = answer(agent().get(&one).call());
        assert_eq!(code, 200, "{body}");
        assert!(!cookie);
        assert!(body.contains("<form method=\"post\">"), "{body}");
        assert!(body.contains("name=\"List-Unsubscribe\" value=\"One-Click\""));
        assert!(
            !body.contains("user1"),
            "the page names the recipient: {body}"
        );
    }
    assert_eq!(recipient_row(&env, "user1@example.test").0, "active");

    // One-click POST, form-urlencoded: 200 at once, no redirect, no cookie.
    let (code, body, cookie) = post_form(&one);
    assert_eq!((code, cookie), (200, false), "{body}");
    assert!(body.contains("unsubscribed"), "{body}");
    let (status, reason, at) = recipient_row(&env, "user1@example.test");
    assert_eq!(status, "unsubscribed");
    assert!(
        reason
            .as_deref()
            .unwrap()
            .starts_with("one-click unsubscribe"),
        "{reason:?}"
    );
    // Repeating it is harmless: same answer, the first record stays.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(post_form(&one).0, 200);
    assert_eq!(post_multipart(&one).0, 200);
    assert_eq!(
        recipient_row(&env, "user1@example.test"),
        (status, reason, at)
    );

    // multipart/form-data works the same.
    let (code, body, cookie) = post_multipart(&two);
    assert_eq!((code, cookie), (200, false), "{body}");
    assert_eq!(recipient_row(&env, "user2@example.test").0, "unsubscribed");

    // Tokens that are not genuine: one answer, nothing changes, nothing
    // about a recipient shows.
    let three = link(3);
    let t3 = three.rsplit('/').next().unwrap();
    let flipped = {
        let mut b = t3.as_bytes().to_vec();
        let last = b.len() - 1;
        b[last] = if b[last] == b'A' { b'B' } else { b'A' };
        String::from_utf8(b).unwrap()
    };
    // A genuine token of another database (its own secret).
    let other = mailsplit::tokens::Signer::new(&[9u8; 32]).unsubscribe_token(1, 3);
    let bad_tokens = [
        flipped,
        t3[..t3.len() - 1].to_string(),
        t3[..t3.len() / 2].to_string(),
        other,
        format!("{t3}A"),
        "A".repeat(5_000),
        "%00".into(),
        "not-a-token".into(),
    ];
    let mut answers = std::collections::HashSet::new();
    for bad in &bad_tokens {
        let url = format!("{base}/u/{bad}");
        for (code, body, _) in [
            answer(agent().get(&url).call()),
            post_form(&url),
            post_multipart(&url),
        ] {
            assert!(code == 404 || code == 400, "{bad}: {code} {body}");
            assert!(!body.contains("user3") && !body.contains("example.test"));
            answers.insert((code, body));
        }
    }
    assert_eq!(answers.len(), 1, "bad tokens are told apart: {answers:?}");
    assert_eq!(answer(agent().post(&format!("{base}/u/")).call()).0, 404);
    assert_eq!(recipient_row(&env, "user3@example.test").0, "active");
    assert_eq!(recipient_row(&env, "user4@example.test").0, "active");
    // The link of the unsubscribed recipient in the message: gone from the
    // next message (preview refuses, a worker skips).
    let out = env.run(&["preview", "news", "--recipient", "user1@example.test"]);
    assert!(!out.status.success());
    assert!(crate::util::stderr(&out).contains("unsubscribed"));
}

/// A recipient unsubscribes while the campaign runs, after their message
/// was claimed and composed (it waits for its domain's rate tokens): the
/// message is not sent, the ledger records it skipped, and the next
/// campaign skips the recipient too.
fn unsubscribe_during_a_running_campaign(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.ok(&["migrate"]);
    let s = serve(&env, None);
    let base = format!("http://127.0.0.1:{}", s.public);
    let csv = env.dir.path().join("people.csv");
    let mut rows = String::from("email,name\n");
    for i in 1..=20 {
        rows.push_str(&format!("user{i}@example.test,User {i}\n"));
    }
    // Two recipients at a domain limited to one message per 1.5 s: the
    // second of them waits, composed and parked, for its token (a token more
    // than 2 s off would defer it to a new job, whose claim then skips it:
    // that path is the claim-time check, not this one).
    rows.push_str("a@late.test,A\nb@late.test,B\n");
    std::fs::write(&csv, rows).unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    env.ok(&["rate", "set", "domain:late.test", "40/m", "--burst", "1"]);
    env.create_campaign("first", "people", &["--public-url", &base]);
    let links: Vec<(String, String)> = ["a@late.test", "b@late.test"]
        .iter()
        .map(|e| (e.to_string(), unsubscribe_link(&env, "first", e)))
        .collect();
    env.ok(&["enqueue", "first"]);
    let _w = env.worker(&["--concurrency", "10"]);

    // Whichever of the two got the first token: unsubscribe the other.
    wait_for(30, "the first late.test message", || {
        peer.count("a@late.test") + peer.count("b@late.test") > 0
    });
    let noticed = Instant::now();
    let (target, link) = links
        .iter()
        .find(|(e, _)| peer.count(e) == 0)
        .cloned()
        .unwrap();
    // Claimed and composed already: the claim-time check is behind it.
    assert_eq!(
        delivery_state(&env, "first", &target).as_deref(),
        Some("claimed")
    );
    assert_eq!(post_form(&link).0, 200);
    let posted = noticed.elapsed();

    wait_done(&env, "first", 60);
    let status = env.status("first");
    assert_eq!(
        peer.count(&target),
        0,
        "{target} was mailed after unsubscribing ({posted:?} after the other was sent)"
    );
    assert_eq!(
        (status["sent"].as_i64(), status["skipped"].as_i64()),
        (Some(21), Some(1))
    );
    assert_eq!(
        delivery_state(&env, "first", &target).as_deref(),
        Some("skipped")
    );

    // Every later campaign skips the recipient.
    env.create_campaign("second", "people", &["--public-url", &base]);
    env.ok(&["enqueue", "second"]);
    wait_done(&env, "second", 60);
    let status = env.status("second");
    assert_eq!(
        (status["sent"].as_i64(), status["skipped"].as_i64()),
        (Some(21), Some(1))
    );
    assert_eq!(peer.count(&target), 0);
    assert_eq!(peer.count("user1@example.test"), 2);
}

both!(one_click_unsubscribe, unsubscribe_during_a_running_campaign,);
