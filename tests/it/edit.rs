//! `campaign edit`: a new content version for a draft or
//! paused campaign, refused while sending and after the end, checked as
//! `create` checks; after pause → edit → resume the workers send the new
//! version from the first message on, every recipient exactly once, and
//! the ledger and `status` say who got which version. Against the real
//! binary, beanstalkd, the scripted SMTP peer, SQLite and PostgreSQL.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::util::*;

fn import(env: &Env, n: usize) {
    let mut csv = String::from("email\n");
    for i in 0..n {
        csv.push_str(&format!("r{i:03}@example.test\n"));
    }
    let path = env.dir.path().join("news.csv");
    std::fs::write(&path, csv).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", path.to_str().unwrap(), "--list", "news"]);
}

fn file(env: &Env, name: &str, text: &str) -> String {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn create(env: &Env, name: &str) {
    let page = file(env, "v1.html", "<p>Version one for {{ email }}</p>\n");
    env.ok(&[
        "campaign",
        "create",
        name,
        "--list",
        "news",
        "--html",
        &page,
        "--subject",
        "V1 news",
        "--from",
        "news@example.test",
    ]);
}

fn subject(message: &str) -> String {
    parts(message).subject
}

/// `deliveries.content_version` of the campaign's sent rows, by address.
fn ledger_versions(env: &Env, campaign: &str) -> HashMap<String, i64> {
    let id = env.status(campaign)["id"].as_i64().unwrap();
    mailsplit::store::content::sent_versions(&mut env.conn(), id)
        .unwrap()
        .into_iter()
        .map(|(e, v)| (e, v.expect("a sent row without its content version")))
        .collect()
}

fn edit_is_refused_while_sending_and_after_the_end(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(kind, Script::default());
    env.smtp = peer.url();
    import(&env, 3);
    create(&env, "weekly");
    // A draft takes edits.
    let out = env.ok(&["campaign", "edit", "weekly", "--subject", "Draft 2"]);
    assert!(out.contains("content version 2"), "{out}");
    assert_eq!(env.status("weekly")["content_version"], 2);
    env.ok(&["enqueue", "weekly"]);
    let out = env.run(&["campaign", "edit", "weekly", "--subject", "Late"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("pause it first"), "{}", stderr(&out));
    let w = env.worker(&[]);
    wait_for(60, "every message sent", || {
        env.status("weekly")["sent"] == 3
    });
    stop_worker(w);
    let out = env.run(&["campaign", "edit", "weekly", "--subject", "Later"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("it is done"), "{}", stderr(&out));
    let status = env.status("weekly");
    assert_eq!(status["content_version"], 2);
    assert_eq!(status["versions"], serde_json::json!({"2": 3}));
    // Cancelled: refused too.
    env.sql("UPDATE campaigns SET state = 'cancelled'");
    let out = env.run(&["campaign", "edit", "weekly", "--subject", "Gone"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("cancelled"), "{}", stderr(&out));
}

fn a_bad_template_in_an_edit_changes_nothing(kind: Kind) {
    let env = World::new(kind);
    import(&env, 2);
    create(&env, "weekly");
    let before = env.ok(&["preview", "weekly", "--recipient", "r000@example.test"]);
    let bad = file(&env, "bad.html", "<p>\nHello\n{{ name </p>\n");
    let out = env.run(&["campaign", "edit", "weekly", "--html", &bad]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("{bad}:3:")),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["campaign", "edit", "weekly", "--subject", "Hi {{ nmae }}"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--subject:1:"), "{}", stderr(&out));
    let text = file(&env, "bad.txt", "Hi\n{% if name %}\n");
    let out = env.run(&["campaign", "edit", "weekly", "--text", &text]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(&text), "{}", stderr(&out));
    assert_eq!(env.status("weekly")["content_version"], 1);
    let after = env.ok(&["preview", "weekly", "--recipient", "r000@example.test"]);
    let body = |m: &str| m.split("\r\n\r\n").skip(1).collect::<String>();
    assert_eq!(subject(&before), subject(&after));
    assert_eq!(body(&before).len(), body(&after).len());
    assert!(after.contains("Version one"), "{after}");
}

fn pause_edit_resume_sends_the_rest_the_new_version(kind: Kind) {
    pause_edit_resume(kind, false);
}

/// The worker killed with -9 once the pause has taken effect (it holds no
/// claim any more); a new worker sends the rest, in the new version.
fn a_worker_killed_while_paused_is_replaced_by_one_sending_the_new_version(kind: Kind) {
    pause_edit_resume(kind, true);
}

fn pause_edit_resume(kind: Kind, kill: bool) {
    const N: usize = 60;
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            data_delay: Duration::from_millis(30),
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, N);
    create(&env, "weekly");
    env.ok(&["enqueue", "weekly"]);
    let mut w = env.worker(&["--concurrency", "2"]);
    wait_for(60, "a first part sent", || {
        env.status("weekly")["sent"].as_i64().unwrap_or(0) >= 10
    });
    env.ok(&["pause", "weekly"]);
    if kill {
        let id = env.status("weekly")["id"].as_i64().unwrap();
        wait_for(60, "every claim handed back", || {
            let counts = mailsplit::store::deliveries::ledger_counts(&mut env.conn(), id).unwrap();
            !counts.contains_key(&mailsplit::store::DeliveryState::Claimed)
        });
        // SIGKILL: nothing of it runs after this.
        w.0.kill().unwrap();
        w.0.wait().unwrap();
        w = env.worker(&["--concurrency", "2"]);
    }
    let v2 = file(&env, "v2.html", "<p>Version two for {{ email }}</p>\n");
    let out = env.ok(&[
        "campaign",
        "edit",
        "weekly",
        "--html",
        &v2,
        "--subject",
        "V2 news",
    ]);
    assert!(out.contains("content version 2"), "{out}");
    env.ok(&["resume", "weekly"]);
    wait_for(120, "every message sent", || {
        env.status("weekly")["sent"] == N as i64
    });
    stop_worker(w);

    // The peer's captures, in the order accepted: V1, then only V2.
    let got = peer.messages.lock().unwrap().clone();
    assert_eq!(got.len(), N, "every recipient exactly once");
    let subjects: Vec<String> = got.iter().map(|(_, m)| subject(m)).collect();
    let first_v2 = subjects.iter().position(|s| s == "V2 news").unwrap();
    assert!(first_v2 >= 10, "{subjects:?}");
    assert!(
        subjects[first_v2..].iter().all(|s| s == "V2 news"),
        "a V1 message after the first V2 one: {subjects:?}"
    );
    for (to, m) in &got {
        let two = m.contains("Version two");
        assert_eq!(two, subject(m) == "V2 news", "{to:?}: {m}");
    }
    let received = peer.received.lock().unwrap().clone();
    assert_eq!(received.len(), N);
    assert!(received.values().all(|&n| n == 1), "{received:?}");

    // The ledger says who got which, and `status` counts them.
    let ledger = ledger_versions(&env, "weekly");
    assert_eq!(ledger.len(), N);
    for (to, m) in &got {
        let want = if subject(m) == "V2 news" { 2 } else { 1 };
        assert_eq!(ledger[&to[0]], want, "{}", to[0]);
    }
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for s in &subjects {
        let v = if s == "V2 news" { "2" } else { "1" };
        *counts.entry(v.to_string()).or_default() += 1;
    }
    let status = env.status("weekly");
    assert_eq!(status["content_version"], 2);
    assert_eq!(status["versions"], serde_json::json!(counts));
    let text = env.ok(&["status", "weekly"]);
    assert!(text.contains("content version 2 (sent: v1 "), "{text}");
}

mod refused {
    use super::*;
    both!(edit_is_refused_while_sending_and_after_the_end);
}

mod bad_template {
    use super::*;
    both!(a_bad_template_in_an_edit_changes_nothing);
}

mod pause_resume {
    use super::*;
    both!(
        pause_edit_resume_sends_the_rest_the_new_version,
        a_worker_killed_while_paused_is_replaced_by_one_sending_the_new_version
    );
}
