//! `/api/v1` end to end on both databases: the import's safety rules
//! through `POST /subscribers` (also under concurrent posts of one
//! address), PATCH and DELETE, and a campaign created, enqueued (twice, at
//! once) and sent through the API only, every recipient exactly once.

use std::time::Duration;

use crate::api::{assert_problem, call, json_of, key, serve_logged};
use crate::dkim::unstuffed;
use crate::util::*;
use serde_json::{json, Value};

fn subscriber(s: &Served, k: &str, email: &str) -> Value {
    let r = call(
        s.admin,
        "GET",
        &format!("/api/v1/subscribers/{email}"),
        k,
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    json_of(&r)
}

/// A database with an unsubscriber and a bounced address (by import), a
/// key with `subscribers,read`, and `serve`.
fn setup(kind: Kind) -> ((tempfile::TempDir, Beanstalkd), Env, String, Served) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.ok(&["migrate"]);
    let csv = env.dir.path().join("old.csv");
    let rows = "email,name,status\nun@example.test,Un,unsubscribed\nbo@example.test,Bo,bounced\n";
    std::fs::write(&csv, rows).unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "old"]);
    let k = key(&env, "shop", "subscribers,read");
    let (s, _log) = serve_logged(&env, &[]);
    ((tmp, bs), env, k, s)
}

fn upsert_never_resubscribes(kind: Kind) {
    let (_bs, _env, k, s) = setup(kind);
    let post = |body: Value| call(s.admin, "POST", "/api/v1/subscribers", &k, Some(&body));
    for (email, status) in [
        ("un@example.test", "unsubscribed"),
        ("BO@Example.test", "bounced"),
    ] {
        let r = post(json!({"email": email, "name": "Back", "lists": ["news"]}));
        assert_eq!(r.status, 200, "{}", r.body);
        let got = json_of(&r);
        assert_eq!(got["status"], status, "{got}");
        assert_eq!(
            (&got["name"], &got["lists"]),
            (&json!("Back"), &json!(["news", "old"]))
        );
    }
    // Ten posts of one new address at once: one creates, none fails.
    let codes: Vec<u16> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..10)
            .map(|i| {
                let body =
                    json!({"email": "new@example.test", "attributes": {"n": i}, "lists": ["news"]});
                scope.spawn(move || post(body).status)
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes.iter().filter(|&&c| c == 201).count(), 1, "{codes:?}");
    assert!(codes.iter().all(|&c| c == 201 || c == 200), "{codes:?}");
    let got = subscriber(&s, &k, "new@example.test");
    assert_eq!(got["status"], "active");
    assert!(
        got["created_at"].as_str().unwrap().starts_with("20"),
        "{got}"
    );
}

fn patch_and_forget_keep_refusals(kind: Kind) {
    let (_bs, _env, k, s) = setup(kind);
    let post = |body: Value| call(s.admin, "POST", "/api/v1/subscribers", &k, Some(&body));
    let patch = |email: &str, body: Value| {
        let path = format!("/api/v1/subscribers/{email}");
        call(s.admin, "PATCH", &path, &k, Some(&body))
    };
    let r = post(json!({"email": "new@example.test", "attributes": {"n": 1}, "lists": ["news"]}));
    assert_eq!(r.status, 201, "{}", r.body);
    // PATCH merges, null removes; unsubscribing holds against a later POST.
    let r = patch(
        "new@example.test",
        json!({"name": "Nu", "attributes": {"n": null, "plan": "pro"}}),
    );
    assert_eq!(json_of(&r)["attributes"], json!({"plan": "pro"}));
    assert_problem(
        &patch("new@example.test", json!({"status": "active"})),
        400,
        &k,
    );
    let r = patch("new@example.test", json!({"status": "unsubscribed"}));
    assert_eq!(json_of(&r)["status"], "unsubscribed");
    let again = post(json!({"email": "new@example.test", "lists": ["news"]}));
    assert_eq!(json_of(&again)["status"], "unsubscribed");
    // DELETE forgets the person (see forget.rs): gone, and refused from
    // then on, which holds more than the unsubscription did.
    let r = call(
        s.admin,
        "DELETE",
        "/api/v1/subscribers/un@example.test",
        &k,
        None,
    );
    assert_eq!(r.status, 204, "{}", r.body);
    let got = call(
        s.admin,
        "GET",
        "/api/v1/subscribers/un@example.test",
        &k,
        None,
    );
    assert_eq!(got.status, 404, "{}", got.body);
    let again = post(json!({"email": "un@example.test", "lists": ["news"]}));
    assert_problem(&again, 422, "un@example.test");
    assert_problem(&patch("nobody@example.test", json!({"name": "x"})), 404, &k);
}

fn campaign_end_to_end_through_the_api(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        keep_data: true,
        ..Script::default()
    });
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.ok(&["migrate"]);
    let k = key(&env, "shop", "subscribers,campaigns,read");
    // No `public_url` in the body: the API takes MAILSPLIT_PUBLIC_URL as
    // `campaign create` does.
    let (s, _log) = serve_logged(
        &env,
        &[("MAILSPLIT_PUBLIC_URL", "https://news.example.test")],
    );
    let api = |method: &str, path: &str, body: Option<Value>| {
        call(
            s.admin,
            method,
            &format!("/api/v1{path}"),
            &k,
            body.as_ref(),
        )
    };
    let n = 40;
    for i in 0..n {
        let body = json!({"email": format!("c{i}@example.test"), "name": format!("C {i}"), "lists": ["weekly"]});
        assert_eq!(api("POST", "/subscribers", Some(body)).status, 201);
    }
    let body = json!({"name": "weekly-1", "list": "weekly", "subject": "This week",
        "from": "shop@example.test", "markdown": "# Hello {{ name }}"});
    let r = api("POST", "/campaigns", Some(body));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(json_of(&r)["state"], "draft");
    // Two enqueues at once: the splitter's lease makes them one run.
    let codes: Vec<u16> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| api("POST", "/campaigns/weekly-1/enqueue", None).status))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes, vec![202, 202]);
    let _w = env.worker(&[]);
    wait_for(60, "the campaign to finish", || {
        let c = json_of(&api("GET", "/campaigns/weekly-1", None));
        c["state"] == "done" && c["sent"] == n
    });
    // A late third enqueue puts nothing either.
    assert_eq!(api("POST", "/campaigns/weekly-1/enqueue", None).status, 202);
    std::thread::sleep(Duration::from_millis(1500));
    // One job of 100 recipients was ever put, and each got one message.
    assert_eq!(bs.tube_stat(&env.tube, "total-jobs"), 1);
    for i in 0..n {
        assert_eq!(peer.count(&format!("c{i}@example.test")), 1, "c{i}");
    }
    assert_eq!(peer.total(), n);
    let all = json_of(&api("GET", "/campaigns", None));
    assert_eq!(all[0], env.status("weekly-1"));
    assert_eq!(
        (&all[0]["enqueued"], &all[0]["jobs"]),
        (&json!(n), &json!(1))
    );
    assert_problem(&api("POST", "/campaigns/weekly-1/pause", None), 409, &k);
    let m = unstuffed(&peer.messages.lock().unwrap()[0].1);
    let unsub = header(&m, "List-Unsubscribe");
    assert!(
        unsub
            .iter()
            .any(|h| h.contains("https://news.example.test/")),
        "{unsub:?}"
    );
}

both!(
    upsert_never_resubscribes,
    patch_and_forget_keep_refusals,
    campaign_end_to_end_through_the_api,
);
