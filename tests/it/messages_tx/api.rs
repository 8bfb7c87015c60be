//! `POST /api/v1/messages` and `GET /api/v1/messages/{id}`: scope `send`,
//! 202 with the id, the same `Idempotency-Key` and body the same id under
//! concurrent posts, 409 for the key with another body, 422 for an unknown
//! template or a bad `to`, and the message read back once sent (with
//! `read`, or `send` alone).

use serde_json::json;

use super::templates;
use crate::api::{assert_problem, call, json_of, key, serve_logged};
use crate::util::*;

fn post(port: u16, k: &str, idem: &str, body: &serde_json::Value) -> Http {
    let auth = format!("Bearer {k}");
    let text = body.to_string();
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Idempotency-Key", idem),
    ];
    http("POST", port, "/api/v1/messages", &headers, Some(&text))
}

fn messages_through_the_api(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    templates(&env);
    let sender = key(&env, "shop", "send,read");
    let reader = key(&env, "audit", "read");
    let send_only = key(&env, "app", "send");
    let other_scope = key(&env, "crm", "subscribers");
    let (s, _log) = serve_logged(&env, &[]);
    let body =
        json!({"template": "order", "to": "Ada <ada@example.org>", "data": {"order_id": "A-9"}});
    // A key without `send`: 403, nothing stored.
    assert_problem(&post(s.admin, &reader, "k-1", &body), 403, &reader);
    let answers: Vec<Http> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..20)
            .map(|_| sc.spawn(|| post(s.admin, &sender, "k-1", &body)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ids: Vec<i64> = answers
        .iter()
        .map(|r| {
            assert_eq!(r.status, 202, "{}", r.body);
            let v = json_of(r);
            assert_eq!(v["status"], "queued", "{v}");
            v["id"].as_i64().unwrap()
        })
        .collect();
    assert!(ids.iter().all(|&i| i == ids[0]), "{ids:?}");
    let other =
        json!({"template": "order", "to": "Ada <ada@example.org>", "data": {"order_id": "A-10"}});
    assert_problem(&post(s.admin, &sender, "k-1", &other), 409, &sender);
    let unknown = json!({"template": "nope", "to": "ada@example.org"});
    assert_problem(&post(s.admin, &sender, "k-2", &unknown), 422, &sender);
    let bad_to = json!({"template": "order", "to": "not an address"});
    assert_problem(&post(s.admin, &sender, "k-3", &bad_to), 422, &sender);
    let w = env.worker(&[]);
    let path = format!("/api/v1/messages/{}", ids[0]);
    wait_for(30, "sent", || {
        json_of(&call(s.admin, "GET", &path, &reader, None))["status"] == "sent"
    });
    stop_worker(w);
    let v = json_of(&call(s.admin, "GET", &path, &reader, None));
    assert_eq!(
        (v["template"].as_str(), v["to"].as_str()),
        (Some("order"), Some("Ada <ada@example.org>"))
    );
    assert!(
        v["sent_at"].is_string() && v["created_at"].is_string(),
        "{v}"
    );
    assert_eq!(peer.total(), 1);
    // The application that sent it may ask how it went with `send` alone;
    // a key with neither `read` nor `send` may not.
    let own = call(s.admin, "GET", &path, &send_only, None);
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(json_of(&own)["status"], "sent");
    assert_problem(
        &call(s.admin, "GET", &path, &other_scope, None),
        403,
        &other_scope,
    );
    assert_problem(
        &call(s.admin, "GET", "/api/v1/messages/999999", &reader, None),
        404,
        &reader,
    );
}

both!(messages_through_the_api);
