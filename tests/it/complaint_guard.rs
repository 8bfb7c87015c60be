//! The complaint guard: real ARF reports (the shared fixtures, aimed at
//! our messages by their VERP envelope sender) fed through `mailsplit
//! bounce` pause a campaign once its complaints pass
//! `--max-complaint-rate` after 1,000 delivered, with the reason in
//! `status` and a `campaign.paused` webhook event; under the limit, or
//! before 1,000 delivered, nothing pauses.

use std::io::Write;
use std::process::Stdio;

use crate::util::*;
use crate::webhooks::{Receiver, SECRET};

/// `mailsplit bounce` with `message` on stdin; it must succeed.
fn bounce(env: &Env, message: &[u8]) {
    let mut child = env
        .cmd(&["bounce"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(message).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A real ARF abuse report about our message to `rcpt`, whose envelope
/// sender was `verp`: Yahoo's for even `n`, Rackspace's for odd.
fn complaint(n: usize, rcpt: &str, verp: &str) -> String {
    let (file, their_rcpt, their_sender) = if n.is_multiple_of(2) {
        (
            "arf-yahoo-abuse.eml",
            "this-local-part-does-not-exist-on-yahoo@yahoo.com",
            "shironeko@example.com",
        )
    } else {
        (
            "arf-rackspace-abuse.eml",
            "hashed@example.com",
            "alice@example.com",
        )
    };
    let text = std::fs::read_to_string(bounce_fixtures().join(file)).unwrap();
    assert!(text.contains(their_sender), "{file}");
    text.replace(their_rcpt, rcpt).replace(their_sender, verp)
}

/// Send campaign `name` (its list imported already) to the peer with a
/// VERP return path; returns each recipient's envelope sender.
fn send(env: &Env, peer: &ScriptedSmtp, name: &str) -> std::collections::HashMap<String, String> {
    env.create_campaign(
        name,
        name,
        &["--return-path", "bounces@bounce.example.test"],
    );
    env.ok(&["enqueue", name]);
    let _w = env.worker(&["--concurrency", "20"]);
    wait_done(env, name, 120);
    peer.senders.lock().unwrap().clone()
}

fn complaints_pause_a_campaign_past_its_limit(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    let receiver = Receiver::start(0);
    env.ok(&["migrate"]);
    env.ok(&[
        "webhook",
        "add",
        &receiver.url("/hook"),
        "--events",
        "campaign.paused",
        "--secret",
        SECRET,
        "--allow-local",
    ]);
    // A small campaign first: 4 complaints of 40 is 10 %, but 40
    // delivered say nothing yet.
    env.import_n("small", 40);
    let small = send(&env, &peer, "small");
    for (n, i) in (1..=4).enumerate() {
        let rcpt = format!("user{i}@example.test");
        bounce(&env, complaint(n, &rcpt, &small[&rcpt]).as_bytes());
    }
    let s = env.status("small");
    assert_eq!(
        (s["complaints"].as_i64(), s["state"].as_str()),
        (Some(4), Some("done")),
        "{s}"
    );

    // 1,046 delivered (the small campaign's four complainers are
    // unsubscribed, so skipped): 3 complaints (0.29 %) are under the 0.3 %
    // default, the fourth (0.38 %) pauses it.
    env.import_n("news", 1_050);
    let news = send(&env, &peer, "news");
    let complain = |n: usize| {
        let rcpt = format!("user{}@example.test", 100 + n);
        bounce(&env, complaint(n, &rcpt, &news[&rcpt]).as_bytes());
    };
    for n in 0..3 {
        complain(n);
    }
    let s = env.status("news");
    assert_eq!(
        (s["sent"].as_i64(), s["complaints"].as_i64()),
        (Some(1_046), Some(3)),
        "{s}"
    );
    assert_ne!(s["state"], "paused", "{s}");
    complain(3);
    let s = env.status("news");
    assert_eq!(s["state"], "paused", "{s}");
    let why = s["pause_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("4 complaints of 1046 delivered (0.38 %, limit 0.30 %)"),
        "{s}"
    );
    let human = env.ok(&["status", "news"]);
    assert!(human.contains("4 complaints of 1046 delivered"), "{human}");
    // Workers deliver webhook events.
    let _w = env.worker(&[]);
    wait_for(30, "campaign.paused at the webhook", || {
        !receiver.taken("/hook").is_empty()
    });
    let events = receiver.taken("/hook");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "campaign.paused", "{events:?}");
    assert_eq!(events[0]["campaign"], "news", "{events:?}");
}

/// `--max-complaint-rate off` never pauses; a bad value is a usage error
/// that names the flag.
fn the_limit_can_be_set_or_turned_off(kind: Kind) {
    let (_tmp, _bs, _peer, env) = setup(kind, Script::default());
    env.import_n("news", 3);
    let out = env.try_create_campaign("c", "news", &["--max-complaint-rate", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--max-complaint-rate"),
        "{}",
        stderr(&out)
    );
    env.create_campaign("off", "news", &["--max-complaint-rate", "off"]);
    env.create_campaign("tight", "news", &["--max-complaint-rate", "0.1%"]);
    env.create_campaign("plain", "news", &[]);
    let mut conn = env.conn();
    for (name, want) in [
        ("off", None),
        ("tight", Some(0.001)),
        ("plain", Some(0.003)),
    ] {
        let got = limit_of(&mut conn, name);
        assert_eq!(got, want, "{name}");
    }
}

fn limit_of(conn: &mut mailsplit::store::Conn, name: &str) -> Option<f64> {
    mailsplit::store::campaigns::find(conn, name)
        .unwrap()
        .max_complaint_rate
}

both!(
    complaints_pause_a_campaign_past_its_limit,
    the_limit_can_be_set_or_turned_off,
);
