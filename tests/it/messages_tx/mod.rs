//! Transactional messages: message templates, `send` and the
//! library's `submit`, and the workers that send them above every
//! campaign. Against the real binary, beanstalkd, the scripted SMTP peer,
//! SQLite and PostgreSQL: exactly once per idempotency key under 50
//! concurrent submits, suppressions per stream, a message overtaking a
//! big campaign, 4xx retried and 5xx failed with the reply, DKIM, and a
//! worker killed while the relay holds the message.

use std::time::{Duration, Instant};

use mailsplit::messages::{self, Queue, Submit};
use mailsplit::store::messages::MessageStatus;

use crate::dkim::{dkimpy, txt_record, unstuffed};
use crate::util::*;

mod api;
mod bounces;
mod sessions;
mod templates;

/// Migrate; template `order` (transactional, uses data and attributes)
/// and `promo` (marketing).
pub(super) fn templates(env: &Env) {
    env.ok(&["migrate"]);
    let html = env.dir.path().join("order.html");
    std::fs::write(
        &html,
        "<p>Hello {{ name | default('friend') }} from {{ attributes.city }}: order {{ data.order_id }}, total {{ data.total }}</p>\n",
    )
    .unwrap();
    let f = html.to_str().unwrap();
    env.ok(&[
        "template",
        "create",
        "order",
        "--subject",
        "Order {{ data.order_id }}",
        "--from",
        "Shop <shop@example.test>",
        "--html",
        f,
    ]);
    env.ok(&[
        "template",
        "create",
        "promo",
        "--subject",
        "Sale",
        "--from",
        "shop@example.test",
        "--html",
        f,
        "--stream",
        "marketing",
    ]);
}

/// `send TEMPLATE --to TO [extra…] --json`: the id and status.
pub(super) fn send(env: &Env, template: &str, to: &str, extra: &[&str]) -> (i64, String) {
    let mut args = vec!["send", template, "--to", to, "--json"];
    args.extend_from_slice(extra);
    let v: serde_json::Value = serde_json::from_str(env.ok(&args).trim()).unwrap();
    (
        v["id"].as_i64().unwrap(),
        v["status"].as_str().unwrap().to_string(),
    )
}

pub(super) fn status(env: &Env, id: i64) -> mailsplit::messages::MessageView {
    messages::get(&mut env.conn(), id).unwrap()
}

pub(super) fn wait_status(
    env: &Env,
    id: i64,
    want: MessageStatus,
    secs: u64,
) -> mailsplit::messages::MessageView {
    wait_for(secs, &format!("message {id} {want}"), || {
        status(env, id).status == want
    });
    status(env, id)
}

fn queue(env: &Env) -> Queue {
    Queue {
        servers: vec![env.beanstalkd.parse().unwrap()],
        tube: env.tube.clone(),
    }
}

pub(super) fn ledger_count(env: &Env) -> i64 {
    mailsplit::store::messages::count_all(&mut env.conn()).unwrap()
}

/// `n` threads, each with its own connection, submit one message under
/// one key at the same moment; each one's (id, created).
fn submit_concurrently(env: &Env, n: usize) -> Vec<(i64, bool)> {
    let data = serde_json::json!({"order_id": "A-1", "total": "9.99"});
    let q = queue(env);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
    let ids: Vec<(i64, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (q, data, barrier, url) =
                    (q.clone(), data.clone(), barrier.clone(), env.db.url.clone());
                s.spawn(move || {
                    let mut conn = mailsplit::store::Conn::open(&url).unwrap();
                    barrier.wait();
                    let done = messages::submit(
                        &mut conn,
                        &q,
                        Submit {
                            template: "order".into(),
                            to: "Ada <ada@example.org>".into(),
                            data: Some(data),
                            idempotency_key: Some("order-A-1".into()),
                        },
                    )
                    .unwrap();
                    (done.id, done.created)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    ids
}

/// 50 threads submit one key at once: one id, one row, one message at
/// the peer; the same key with other data is refused and sends nothing.
fn exactly_once_per_key(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    templates(&env);
    let ids = submit_concurrently(&env, 50);
    let first = ids[0].0;
    assert!(ids.iter().all(|&(id, _)| id == first), "{ids:?}");
    assert_eq!(
        ids.iter().filter(|&&(_, created)| created).count(),
        1,
        "{ids:?}"
    );
    assert_eq!(ledger_count(&env), 1);
    // Same key, other body: refused, nothing stored, exit 2.
    let out = env.run(&[
        "send",
        "order",
        "--to",
        "Ada <ada@example.org>",
        "--data",
        r#"{"order_id":"A-2"}"#,
        "--idempotency-key",
        "order-A-1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already used for another message"),
        "{}",
        stderr(&out)
    );
    assert_eq!(ledger_count(&env), 1);
    // A retry through the CLI with the same body: same id, not created.
    let (again, _) = send(
        &env,
        "order",
        "Ada <ada@example.org>",
        &[
            "--data",
            r#"{"order_id":"A-1","total":"9.99"}"#,
            "--idempotency-key",
            "order-A-1",
        ],
    );
    assert_eq!(again, first);

    let w = env.worker(&["--concurrency", "4"]);
    let view = wait_status(&env, first, MessageStatus::Sent, 30);
    // Give any duplicate a chance to arrive before counting.
    std::thread::sleep(Duration::from_secs(2));
    stop_worker(w);
    assert_eq!(
        peer.received.lock().unwrap().get("ada@example.org"),
        Some(&1)
    );
    assert_eq!(peer.total(), 1);
    assert!(view.sent_at.is_some());
    assert_eq!(view.template, "order");
}

/// List `people`: bob bounced, una unsubscribed, ada and com active,
/// and a complaint on record for com (as `mailsplit bounce` writes one).
fn people(env: &Env) {
    let csv = env.dir.path().join("people.csv");
    std::fs::write(
        &csv,
        "email,name,status,city\nbob@example.org,Bob,bounced,Oslo\nuna@example.org,Una,unsubscribed,Rome\nada@example.org,Ada,active,Paris\ncom@example.org,Com,active,Lima\n",
    )
    .unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    // A complaint on record for com@ (as `mailsplit bounce` writes one).
    env.sql(
        "INSERT INTO bounces (recipient_id, campaign_id, email, kind, status, reason, source, fingerprint, received_at) \
         SELECT id, NULL, email, 'complaint', NULL, 'abuse report', 'test', 'fp-com', 0 FROM recipients WHERE email = 'com@example.org'",
    );
}

/// Bounced and complained addresses are never sent to (`suppressed`);
/// an unsubscribed one gets transactional mail but no marketing mail;
/// marketing mail carries List-Unsubscribe, transactional mail does not.
fn suppressions_per_stream(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    templates(&env);
    people(&env);
    let (bounced, s1) = send(&env, "order", "BOB@example.org", &[]);
    let (complained, s2) = send(&env, "order", "com@example.org", &[]);
    let (unsub_marketing, s3) = send(&env, "promo", "una@example.org", &[]);
    assert_eq!(
        (s1.as_str(), s2.as_str(), s3.as_str()),
        ("suppressed", "suppressed", "suppressed")
    );
    let (unsub_tx, _) = send(
        &env,
        "order",
        "Una <una@example.org>",
        &["--data", r#"{"order_id":"U-1"}"#],
    );
    let (active_marketing, _) = send(&env, "promo", "ada@example.org", &[]);
    let w = env.worker(&[]);
    wait_status(&env, unsub_tx, MessageStatus::Sent, 30);
    wait_status(&env, active_marketing, MessageStatus::Sent, 30);
    std::thread::sleep(Duration::from_secs(1));
    stop_worker(w);
    for id in [bounced, complained, unsub_marketing] {
        let v = status(&env, id);
        assert_eq!(v.status, MessageStatus::Suppressed, "{v:?}");
        assert!(v.reply.is_some(), "{v:?}");
    }
    let received = peer.received.lock().unwrap().clone();
    assert_eq!(received.get("una@example.org"), Some(&1), "{received:?}");
    assert_eq!(received.get("ada@example.org"), Some(&1), "{received:?}");
    assert_eq!(received.len(), 2, "{received:?}");
    let kept = peer.messages.lock().unwrap().clone();
    let to = |addr: &str| {
        kept.iter()
            .find(|(rcpts, _)| rcpts.iter().any(|r| r == addr))
            .map(|(_, t)| unstuffed(t))
            .unwrap()
    };
    let tx = to("una@example.org");
    assert!(header(&tx, "List-Unsubscribe").is_empty(), "{tx}");
    let p = parts(&tx);
    assert_eq!(p.subject, "Order U-1");
    // The recipient's own attributes and the message's data both render.
    assert!(
        p.text.contains("Hello Una from Rome: order U-1"),
        "{}",
        p.text
    );
    let mk = to("ada@example.org");
    assert_eq!(header(&mk, "List-Unsubscribe").len(), 1, "{mk}");
}

/// A campaign of 3,000 recipients is under way on one worker with one
/// SMTP session; a message submitted then arrives before any campaign
/// message the worker did not already hold. A FIFO queue would send it
/// after all 3,000.
fn message_overtakes_a_big_campaign(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            data_delay: Duration::from_millis(3),
            ..Script::default()
        },
    );
    env.bulk_campaign_without_enqueue("big", 3000);
    templates(&env);
    env.ok(&["enqueue", "big"]);
    let w = env.worker(&["--concurrency", "1"]);
    wait_for(60, "the campaign under way", || peer.total() >= 100);
    let (id, _) = send(
        &env,
        "order",
        "vip@example.org",
        &["--data", r#"{"order_id":"V-1"}"#],
    );
    let submitted_at = peer.total();
    wait_for(60, "the message", || {
        peer.received
            .lock()
            .unwrap()
            .contains_key("vip@example.org")
    });
    let at_arrival = peer.total();
    stop_worker(w);
    wait_status(&env, id, MessageStatus::Sent, 5);
    // What the worker may hold when the message comes, whatever the load:
    // its job slots full of campaign jobs (3 of 100 recipients at
    // `--concurrency 1`), and its parked and in-flight messages (up to 105).
    // A FIFO queue would send the other ~2,900 first.
    let in_hand = 3 * 100 + 105;
    assert!(
        at_arrival - submitted_at <= in_hand,
        "the message came after {at_arrival} messages (submitted after {submitted_at}) of a 3000-recipient campaign"
    );
    assert!(env.status("big")["sent"].as_i64().unwrap() < 3000);
}

/// A 4xx is retried (status queued with the reply meanwhile) and then
/// sent; a 5xx fails at once with the relay's reply recorded.
fn temporary_then_sent_permanent_failed(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            tempfail: Some(("retry".into(), 1)),
            reject: Some("reject".into()),
            ..Script::default()
        },
    );
    templates(&env);
    let (retried, _) = send(&env, "order", "retry@example.org", &[]);
    let (rejected, _) = send(&env, "order", "reject@example.org", &[]);
    let w = env.worker(&[]);
    let failed = wait_status(&env, rejected, MessageStatus::Failed, 30);
    assert!(
        failed.reply.as_deref().unwrap_or("").contains("550"),
        "{failed:?}"
    );
    assert!(failed.sent_at.is_none());
    let shown: serde_json::Value = serde_json::from_str(
        env.ok(&["message", "show", &rejected.to_string(), "--json"])
            .trim(),
    )
    .unwrap();
    assert_eq!(shown["status"], "failed");
    assert!(shown["reply"].as_str().unwrap().contains("550"), "{shown}");
    assert!(shown.get("sent_at").is_none(), "{shown}");
    let sent = wait_status(&env, retried, MessageStatus::Sent, 40);
    std::thread::sleep(Duration::from_secs(1));
    stop_worker(w);
    assert_eq!(
        peer.tries.lock().unwrap().get("retry@example.org"),
        Some(&2)
    );
    assert_eq!(
        peer.tries.lock().unwrap().get("reject@example.org"),
        Some(&1)
    );
    assert_eq!(
        peer.received.lock().unwrap().get("retry@example.org"),
        Some(&1)
    );
    assert!(peer
        .received
        .lock()
        .unwrap()
        .get("reject@example.org")
        .is_none());
    assert!(sent.sent_at.is_some());
}

/// A relay that throttles at MAIL FROM (two a second, 454 as Amazon SES
/// answers over its quota), twelve messages at once, a worker that fails
/// a message after its first 4xx: a throttle is not the message's fault,
/// so every message is sent, none failed, each once.
fn a_throttled_message_is_tried_again_not_failed(kind: Kind) {
    let quota = std::sync::Arc::new(MailQuota::new(2));
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            pipelining: true,
            mail_quota: Some(quota.clone()),
            ..Script::default()
        },
    );
    templates(&env);
    let ids: Vec<(String, i64)> = (0..12)
        .map(|i| {
            let to = format!("buyer{i}@example.org");
            let (id, _) = send(&env, "order", &to, &[]);
            (to, id)
        })
        .collect();
    let w = env.worker(&["--max-attempts", "1"]);
    wait_for(60, "every message sent or failed", || {
        ids.iter().all(|(_, id)| {
            matches!(
                status(&env, *id).status,
                MessageStatus::Sent | MessageStatus::Failed
            )
        })
    });
    stop_worker(w);
    for (to, id) in &ids {
        let m = status(&env, *id);
        assert_eq!(m.status, MessageStatus::Sent, "{to}: {m:?}");
    }
    let (_, throttled) = quota.attempts_since(Instant::now() - Duration::from_secs(3600));
    assert!(
        throttled > 0,
        "the relay never throttled: the test tests nothing"
    );
    for (to, _) in &ids {
        assert_eq!(peer.received.lock().unwrap().get(to), Some(&1), "{to}");
    }
}

/// With a key for the From domain, the message is signed and dkimpy
/// verifies it.
fn messages_are_dkim_signed(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    templates(&env);
    let record = txt_record(&env.ok(&["dkim", "keygen", "example.test"]));
    let (id, _) = send(
        &env,
        "order",
        "ada@example.org",
        &["--data", r#"{"order_id":"D-1"}"#],
    );
    let w = env.worker(&[]);
    wait_status(&env, id, MessageStatus::Sent, 30);
    stop_worker(w);
    let m = unstuffed(&peer.messages.lock().unwrap()[0].1);
    let results = dkimpy(&m, &[record]);
    assert_eq!(results.len(), 1, "{m}");
    assert_eq!(results[0]["ok"], true, "{:?}\n{m}", results[0]);
    assert_eq!(results[0]["d"], "example.test");
}

/// A worker killed while the relay holds the message (after the claim,
/// before the record) never leads to a second copy: another worker finds
/// the lapsed `sending` claim and fails the message, saying why.
fn worker_killed_mid_send_never_sends_twice(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            data_delay: Duration::from_secs(3),
            ..Script::default()
        },
    );
    templates(&env);
    let (id, _) = send(&env, "order", "ada@example.org", &[]);
    let mut w = env.worker(&[]);
    // Claimed, marked `sending`, and at the relay, which holds DATA's answer.
    wait_for(30, "the message on the wire", || {
        let sending = mailsplit::store::messages::find(&mut env.conn(), id)
            .unwrap()
            .is_some_and(|m| m.status == MessageStatus::Sending);
        sending && peer.tries.lock().unwrap().contains_key("ada@example.org")
    });
    signal(&w.0, "KILL");
    let _ = w.0.wait();
    let started = Instant::now();
    let w2 = env.worker(&[]);
    let v = wait_status(&env, id, MessageStatus::Failed, 60);
    stop_worker(w2);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(v.reply.unwrap().contains("never sent twice"));
    // At most the one copy the killed worker handed over.
    assert!(peer.total() <= 1, "{}", peer.total());
    assert_eq!(peer.tries.lock().unwrap().get("ada@example.org"), Some(&1));
}

/// A running worker compiles a template once per version: after `template
/// edit`, its next message carries the new subject, not the compiled copy
/// of the old one.
fn an_edit_reaches_a_running_worker(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    templates(&env);
    let w = env.worker(&[]);
    let data = ["--data", r#"{"order_id":"E-1"}"#];
    let (first, _) = send(&env, "order", "ada@example.org", &data);
    wait_status(&env, first, MessageStatus::Sent, 30);
    env.ok(&[
        "template",
        "edit",
        "order",
        "--subject",
        "Shipped {{ data.order_id }}",
    ]);
    let (second, _) = send(&env, "order", "bob@example.org", &data);
    wait_status(&env, second, MessageStatus::Sent, 30);
    stop_worker(w);
    let kept = peer.messages.lock().unwrap().clone();
    let subject = |addr: &str| {
        let (_, text) = kept
            .iter()
            .find(|(rcpts, _)| rcpts.iter().any(|r| r == addr))
            .unwrap_or_else(|| panic!("nothing reached {addr}"));
        parts(&unstuffed(text)).subject
    };
    assert_eq!(subject("ada@example.org"), "Order E-1");
    assert_eq!(subject("bob@example.org"), "Shipped E-1");
}

/// The library keeps its beanstalkd connections between submits; after
/// beanstalkd restarts, the next submit finds its kept connection dead,
/// puts the job on a new one, and both messages are sent once.
fn a_submit_after_beanstalkd_restarts(kind: Kind) {
    let (_tmp, mut bs, peer, env) = setup(kind, Script::default());
    templates(&env);
    let mut conn = env.conn();
    let one = |conn: &mut mailsplit::store::Conn, to: &str| {
        messages::submit(
            conn,
            &queue(&env),
            Submit {
                template: "order".into(),
                to: to.into(),
                data: Some(serde_json::json!({"order_id": to})),
                idempotency_key: None,
            },
        )
        .unwrap()
        .id
    };
    let first = one(&mut conn, "ada@example.org");
    assert_eq!(bs.live_jobs(&env.tube), 1);
    bs.restart();
    let second = one(&mut conn, "bob@example.org");
    assert_eq!(bs.live_jobs(&env.tube), 2);
    let w = env.worker(&[]);
    wait_status(&env, first, MessageStatus::Sent, 30);
    wait_status(&env, second, MessageStatus::Sent, 30);
    stop_worker(w);
    assert_eq!(peer.total(), 2);
}

both!(
    exactly_once_per_key,
    a_submit_after_beanstalkd_restarts,
    an_edit_reaches_a_running_worker,
    suppressions_per_stream,
    message_overtakes_a_big_campaign,
    temporary_then_sent_permanent_failed,
    a_throttled_message_is_tried_again_not_failed,
    messages_are_dkim_signed,
    worker_killed_mid_send_never_sends_twice,
);
