//! Message templates on the command line, `send`'s refusals, and the
//! webhook events of messages.

use crate::util::*;

use super::{ledger_count, send, templates};

/// `template` commands: a bad template names file and line (exit 2),
/// an unknown variable too; edit makes a new version; rm removes.
fn template_commands(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    templates(&env);
    let bad = env.dir.path().join("bad.html");
    std::fs::write(&bad, "<p>ok</p>\n<p>{{ data.x }</p>\n").unwrap();
    let create = |name: &str| {
        let file = bad.to_str().unwrap();
        let args = [
            "template",
            "create",
            name,
            "--subject",
            "s",
            "--from",
            "a@example.test",
            "--html",
            file,
        ];
        env.run(&args)
    };
    let out = create("bad");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("bad.html:2"), "{}", stderr(&out));
    // `row` is a flow row's (a variable of every message template now).
    std::fs::write(&bad, "<p>{{ cart.x }}</p>\n").unwrap();
    let out = create("bad");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("unknown variable `cart`"), "{err}");
    // A name already taken: refused, the stored one unchanged.
    std::fs::write(&bad, "<p>fine</p>\n").unwrap();
    assert_eq!(create("order").status.code(), Some(2));
    let edit = [
        "template",
        "edit",
        "order",
        "--subject",
        "Your order {{ data.order_id }}",
    ];
    assert!(env.ok(&edit).contains("version 2"));
    let ls = env.ok(&["template", "ls", "--json"]);
    let order: serde_json::Value =
        serde_json::from_str(ls.lines().find(|l| l.contains("\"order\"")).unwrap()).unwrap();
    assert_eq!(order["version"], 2);
    assert_eq!(order["stream"], "transactional");
}

/// `send` refuses what it cannot send, storing nothing: a removed or
/// unknown template, data that is not an object, data over 64 KB.
fn send_refuses_bad_input(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    templates(&env);
    env.ok(&["template", "rm", "promo"]);
    assert!(!env.ok(&["template", "ls"]).contains("promo"));
    let out = env.run(&["send", "promo", "--to", "a@example.org"]);
    assert_eq!(out.status.code(), Some(2));
    let out = env.run(&["send", "order", "--to", "a@example.org", "--data", "[1,2]"]);
    assert_eq!(out.status.code(), Some(2));
    let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(70_000));
    let out = env.run(&["send", "order", "--to", "a@example.org", "--data", &big]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("limit"), "{}", stderr(&out));
    assert_eq!(ledger_count(&env), 0);
}

/// Webhooks report a message's `sent` and `failed` with `"message": ID`
/// instead of `"campaign"`, signed like every event.
fn webhooks_name_the_message(kind: Kind) {
    use crate::webhooks::{Receiver, SECRET};
    let (_tmp, _bs, _peer, env) = setup(
        kind,
        Script {
            reject: Some("reject".into()),
            ..Script::default()
        },
    );
    templates(&env);
    let receiver = Receiver::start(0);
    let hook = receiver.url("/hook");
    env.ok(&[
        "webhook",
        "add",
        &hook,
        "--events",
        "sent,failed",
        "--secret",
        SECRET,
        "--allow-local",
    ]);
    let (sent, _) = send(&env, "order", "Ada <ada@example.org>", &[]);
    let (failed, _) = send(&env, "order", "reject@example.org", &[]);
    let w = env.worker(&[]);
    wait_for(60, "two events", || receiver.taken("/hook").len() >= 2);
    stop_worker(w);
    let events = receiver.taken("/hook");
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        assert!(e.get("campaign").is_none(), "{e}");
        let (id, email) = match e["type"].as_str().unwrap() {
            "sent" => (sent, "ada@example.org"),
            "failed" => (failed, "reject@example.org"),
            other => panic!("unexpected event {other}: {e}"),
        };
        assert_eq!(e["message"], id, "{e}");
        assert_eq!(e["email"], email, "{e}");
    }
}

both!(
    template_commands,
    send_refuses_bad_input,
    webhooks_name_the_message
);
