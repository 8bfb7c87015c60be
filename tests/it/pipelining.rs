//! SMTP PIPELINING (RFC 2920) end to end: a worker against smtp-sink
//! (which offers it) and against a scripted relay that refuses single
//! recipients, with and without PIPELINING on offer. The ledger must say
//! exactly which recipients failed or were retried, whatever the exchange.

use crate::util::*;

/// Refused recipients: 550 (permanent) for user3 and user11, 452
/// (temporary, every try) for user5 and user17.
fn refusing(pipelining: bool) -> Script {
    Script {
        pipelining,
        rcpt_replies: vec![
            ("user3@".into(), "550 5.1.1 no such user here".into()),
            ("user11@".into(), "550 5.7.1 refused by policy".into()),
            ("user5@".into(), "452 4.2.2 mailbox full".into()),
            ("user17@".into(), "452 4.2.2 mailbox full".into()),
        ],
        ..Script::default()
    }
}

/// 40 recipients, two sessions, at most two attempts each: exactly the
/// four refused recipients fail (the 452s after their second try), each
/// with its own reply in the ledger; the other 36 are delivered once.
fn partial_failures(pipelining: bool) -> ScriptedSmtp {
    let (_tmp, _bs, peer, env) = setup(Kind::Sqlite, refusing(pipelining));
    env.campaign("news", 40);
    let _w = env.worker(&["--concurrency", "2", "--max-attempts", "2"]);
    wait_done(&env, "news", 90);
    let s = env.status("news");
    assert_eq!(
        (
            s["sent"].as_i64(),
            s["failed"].as_i64(),
            s["pending"].as_i64()
        ),
        (Some(36), Some(4), Some(0)),
        "{s}"
    );
    assert_eq!(peer.total(), 36);
    assert_eq!(peer.duplicates(), 0);
    for bad in ["user3@", "user11@", "user5@", "user17@"] {
        assert_eq!(peer.count(&format!("{bad}example.test")), 0, "{bad}");
    }
    let tries = peer.tries.lock().unwrap().clone();
    assert_eq!(tries["user3@example.test"], 1);
    assert_eq!(tries["user11@example.test"], 1);
    assert_eq!(tries["user5@example.test"], 2);
    assert_eq!(tries["user17@example.test"], 2);
    let mut conn = env.conn();
    let mut errors = mailsplit::store::deliveries::failures(&mut conn, 1, 10).unwrap();
    errors.sort();
    // Recipient ids follow the CSV: user N has id N. Never the 503/554 a
    // pipelined DATA gets behind a refused RCPT.
    assert_eq!(
        errors,
        [
            (3, "550 5.1.1 no such user here".to_string()),
            (5, "452 4.2.2 mailbox full".to_string()),
            (11, "550 5.7.1 refused by policy".to_string()),
            (17, "452 4.2.2 mailbox full".to_string()),
        ]
    );
    // A refused recipient costs an RSET, not the session.
    assert!(
        peer.sessions.load(std::sync::atomic::Ordering::SeqCst) <= 2,
        "sessions reopened after refusals"
    );
    assert!(peer.resets.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    peer
}

#[test]
fn pipelined_refusals_fail_only_those_recipients_and_commands_go_in_one_flight() {
    use std::sync::atomic::Ordering::SeqCst;
    let peer = partial_failures(true);
    let mails = peer.mails.load(SeqCst);
    assert!(mails >= 42, "{mails} MAIL commands");
    // Every MAIL's RCPT and DATA had arrived before the peer answered it.
    assert_eq!(peer.mails_in_one_flight.load(SeqCst), mails);
}

#[test]
fn without_pipelining_each_command_waits_for_its_reply() {
    use std::sync::atomic::Ordering::SeqCst;
    let peer = partial_failures(false);
    assert!(peer.mails.load(SeqCst) >= 42);
    assert_eq!(peer.mails_in_one_flight.load(SeqCst), 0);
}

#[test]
fn smtp_sink_with_pipelining_takes_every_message() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let sink = SmtpSink::start(&[]);
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = sink.url();
    env.campaign("news", 500);
    let _w = env.worker(&["--concurrency", "4"]);
    wait_done(&env, "news", 90);
    let s = env.status("news");
    assert_eq!(
        (s["sent"].as_i64(), s["failed"].as_i64()),
        (Some(500), Some(0)),
        "{s}"
    );
}
