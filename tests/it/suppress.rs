//! The suppression list (`mailsplit suppress`): addresses and whole
//! `@domains` the workers leave out at claim time, for campaigns (counted
//! as skipped, with the reason, in `report`) and transactional messages
//! (status `suppressed`). Against the real binary, beanstalkd, the
//! scripted SMTP peer, SQLite and PostgreSQL.

use mailsplit::store::messages::MessageStatus;

use crate::messages_tx::{send, templates, wait_status};
use crate::util::*;

/// Import `rows` (email,name) into `list`.
fn import(env: &Env, list: &str, rows: &[&str]) {
    let path = env.dir.path().join(format!("{list}.csv"));
    std::fs::write(&path, format!("email,name\n{}\n", rows.join("\n"))).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", path.to_str().unwrap(), "--list", list]);
}

/// An address and a whole domain suppressed, one before and one after
/// the campaign was enqueued: the worker sends to neither, a subdomain of
/// the suppressed domain is still mailed, and `report` counts them as
/// skipped with the reason.
fn a_campaign_never_mails_suppressed_addresses_or_domains(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    import(
        &env,
        "news",
        &[
            "Ada@Example.org,Ada",
            "bob@blocked.example,Bob",
            "cy@BLOCKED.example,Cy",
            "dee@sub.blocked.example,Dee",
            "eve@example.org,Eve",
            "fay@example.org,Fay",
        ],
    );
    env.ok(&[
        "suppress",
        "add",
        "ada@EXAMPLE.org",
        "--reason",
        "asked by phone",
    ]);
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    // After enqueue, before any worker ran: still applies.
    env.ok(&[
        "suppress",
        "add",
        "@blocked.example",
        "fay@example.org",
        "--reason",
        "old provider",
    ]);
    env.ok(&["suppress", "add", "fay@example.org"]);
    let w = env.worker(&[]);
    wait_done(&env, "news", 60);
    stop_worker(w);
    let received = peer.received.lock().unwrap().clone();
    let mut got: Vec<String> = received.keys().map(|k| k.to_lowercase()).collect();
    got.sort();
    assert_eq!(
        got,
        ["dee@sub.blocked.example", "eve@example.org"],
        "{received:?}"
    );
    let status = env.status("news");
    assert_eq!(
        (status["sent"].as_i64(), status["skipped"].as_i64()),
        (Some(2), Some(4)),
        "{status}"
    );
    let report: serde_json::Value =
        serde_json::from_str(env.ok(&["report", "news", "--json"]).trim()).unwrap();
    let reasons: Vec<(String, i64)> = report["skipped_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["reason"].as_str().unwrap().to_string(),
                r["count"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("suppressed: old provider".to_string(), 3),
            ("suppressed: asked by phone".to_string(), 1)
        ],
        "{report}"
    );
    let text = env.ok(&["report", "news"]);
    assert!(text.contains("suppressed: old provider"), "{text}");
    // `rm` takes an entry off; `ls` shows the rest, case folded.
    env.ok(&["suppress", "rm", "FAY@example.org"]);
    let ls = env.ok(&["suppress", "ls", "--json"]);
    let entries: Vec<String> = ls
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["entry"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(entries, ["@blocked.example", "ada@example.org"], "{ls}");
}

/// A transactional message to a suppressed address (by address or by
/// domain) gets status `suppressed` and is never sent; another is sent.
fn a_message_to_a_suppressed_address_is_suppressed(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    templates(&env);
    let (ada, s1) = send(
        &env,
        "order",
        "Ada <ada@example.org>",
        &["--data", r#"{"order_id":"A"}"#],
    );
    let (bob, s2) = send(
        &env,
        "order",
        "bob@blocked.example",
        &["--data", r#"{"order_id":"B"}"#],
    );
    let (eve, _) = send(
        &env,
        "order",
        "eve@example.org",
        &["--data", r#"{"order_id":"E"}"#],
    );
    assert_eq!((s1.as_str(), s2.as_str()), ("queued", "queued"));
    // Suppressed after the messages were queued: applied when claimed.
    env.ok(&[
        "suppress",
        "add",
        "ADA@example.org",
        "@Blocked.Example",
        "--reason",
        "gdpr",
    ]);
    let w = env.worker(&[]);
    wait_status(&env, eve, MessageStatus::Sent, 30);
    let a = wait_status(&env, ada, MessageStatus::Suppressed, 30);
    let b = wait_status(&env, bob, MessageStatus::Suppressed, 30);
    stop_worker(w);
    assert_eq!(a.reply.as_deref(), Some("suppressed: gdpr"), "{a:?}");
    assert_eq!(b.reply.as_deref(), Some("suppressed: gdpr"), "{b:?}");
    let received = peer.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received.get("eve@example.org"), Some(&1), "{received:?}");
}

/// `suppress import`: a plain list and a CSV with an email column; bad
/// lines are named by number and skipped, the rest added, counts said.
fn import_names_bad_lines_and_adds_the_rest(kind: Kind) {
    let env = World::new(kind);
    env.ok(&["migrate"]);
    let plain = env.dir.path().join("old.txt");
    std::fs::write(
        &plain,
        "ada@example.org\n\n# a comment\nnot an address\n@Blocked.example\nADA@example.org\n@bad domain\n",
    )
    .unwrap();
    let out = env.run(&["suppress", "import", plain.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (so, se) = (stdout(&out), stderr(&out));
    assert!(
        so.contains("read 3 entries: 2 added, 1 already on the list, 2 bad lines skipped"),
        "{so}"
    );
    assert!(
        se.contains("old.txt:4: not an address or @domain: \"not an address\""),
        "{se}"
    );
    assert!(se.contains("old.txt:7:"), "{se}");
    let csv = env.dir.path().join("export.csv");
    std::fs::write(
        &csv,
        "id,Email,created\n1,cy@example.org,x\n2,,y\n3,\"dee@example.org\",z\n",
    )
    .unwrap();
    let out = env.run(&[
        "suppress",
        "import",
        csv.to_str().unwrap(),
        "--reason",
        "mailchimp",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out)
            .contains("read 2 entries: 2 added, 0 already on the list, 1 bad lines skipped"),
        "{}",
        stdout(&out)
    );
    assert!(stderr(&out).contains("export.csv:3:"), "{}", stderr(&out));
    let ls = env.ok(&["suppress", "ls"]);
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 4, "{ls}");
    assert!(
        lines[0].starts_with("@blocked.example") && lines[0].ends_with("imported"),
        "{ls}"
    );
    assert!(
        lines[2].starts_with("cy@example.org") && lines[2].ends_with("mailchimp"),
        "{ls}"
    );
    // A CSV without an email column, and a bad argument: usage errors that say what to give.
    let nocol = env.dir.path().join("nocol.csv");
    std::fs::write(&nocol, "id,mail\n1,a@example.org\n").unwrap();
    let out = env.run(&["suppress", "import", nocol.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no `email` column"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["suppress", "add", "example.org"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("@example.com"), "{}", stderr(&out));
}

/// `subscriber export`: the recipient, lists, the ledger row of each
/// campaign, transactional messages and the suppression entry, found by
/// any spelling; `show` summarises; an unknown address is exit 2.
fn export_holds_every_row_about_the_person(kind: Kind) {
    let (_tmp, _bs, _peer, env) = setup(kind, Script::default());
    templates(&env);
    let path = env.dir.path().join("news.csv");
    std::fs::write(
        &path,
        "email,name,city\nAda@Example.org,Ada Lovelace,Derby\nbob@example.org,Bob,Leeds\n",
    )
    .unwrap();
    env.ok(&["import", path.to_str().unwrap(), "--list", "news"]);
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let (mid, _) = send(
        &env,
        "order",
        "Ada <ada@example.org>",
        &["--data", r#"{"order_id":"A-7"}"#],
    );
    let w = env.worker(&[]);
    wait_done(&env, "news", 60);
    wait_status(&env, mid, MessageStatus::Sent, 30);
    stop_worker(w);
    env.ok(&["suppress", "add", "@example.org", "--reason", "test"]);
    let all: serde_json::Value =
        serde_json::from_str(&env.ok(&["subscriber", "export", "ADA@example.ORG"])).unwrap();
    assert_eq!(all["recipient"]["name"], "Ada Lovelace", "{all}");
    assert_eq!(all["recipient"]["attributes"]["city"], "Derby", "{all}");
    assert_eq!(all["lists"], serde_json::json!(["news"]), "{all}");
    let d = all["deliveries"].as_array().unwrap();
    assert_eq!(d.len(), 1, "{all}");
    assert_eq!(
        (d[0]["campaign"].as_str(), d[0]["state"].as_str()),
        (Some("news"), Some("sent"))
    );
    let m = all["messages"].as_array().unwrap();
    assert_eq!(m.len(), 1, "{all}");
    assert_eq!(m[0]["id"].as_i64(), Some(mid));
    assert_eq!(m[0]["data"]["order_id"], "A-7");
    assert_eq!(all["suppressed"], "suppressed: test", "{all}");
    // Bob's rows are not Ada's.
    assert!(!all.to_string().contains("bob@"), "{all}");
    let show = env.ok(&["subscriber", "show", "ada@example.org"]);
    assert!(
        show.contains("Ada Lovelace")
            && show.contains("1 deliveries")
            && show.contains("1 messages"),
        "{show}"
    );
    let out = env.run(&["subscriber", "export", "nobody@example.net"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing is held about"),
        "{}",
        stderr(&out)
    );
}

both!(
    export_holds_every_row_about_the_person,
    a_campaign_never_mails_suppressed_addresses_or_domains,
    a_message_to_a_suppressed_address_is_suppressed,
    import_names_bad_lines_and_adds_the_rest,
);
