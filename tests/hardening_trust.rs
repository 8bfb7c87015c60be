//! Issue 29, trust: only what we wrote changes anybody. Forged bounces and
//! complaints (an unmailed address, a made-up VERP token, one DSN naming
//! 34 recipients, a troll's ARF, forged sequential Message-IDs) change
//! nobody and are recorded as unverified; genuine reports (by VERP token,
//! by our signed Message-ID, real fixtures) still work.

mod common;

use std::io::Write;
use std::process::{Output, Stdio};

use common::*;
use mailsplit::store::bounces;
use mailsplit::store::RecipientStatus;

/// Run `mailsplit bounce [args]` with `message` on stdin; exit 0 expected.
fn bounce(env: &Env, args: &[&str], message: &[u8]) -> String {
    let mut all = vec!["bounce"];
    all.extend_from_slice(args);
    let mut child = env
        .cmd(&all)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(message).unwrap();
    let out: Output = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stderr(&out)
}

fn rid(env: &Env, email: &str) -> i64 {
    bounces::find_recipient(&mut env.conn(), email)
        .unwrap()
        .unwrap_or_else(|| panic!("no recipient {email}"))
        .0
}

fn status_of(env: &Env, email: &str) -> RecipientStatus {
    bounces::status_of(&mut env.conn(), rid(env, email))
        .unwrap()
        .unwrap()
        .0
}

/// A DSN naming every address of `rcpts` as failed (5.1.1).
fn dsn_many(envelope_to: &str, rcpts: &[String], message_id: &str) -> String {
    let groups: String = rcpts
        .iter()
        .map(|r| {
            format!("Final-Recipient: rfc822; {r}\r\nAction: failed\r\nStatus: 5.1.1\r\nDiagnostic-Code: smtp; 550 5.1.1 unknown\r\n\r\n")
        })
        .collect();
    format!(
        "From: MAILER-DAEMON@mta.attacker.test\r\nTo: {envelope_to}\r\nSubject: Undelivered Mail\r\n\
MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=delivery-status; boundary=\"b\"\r\n\r\n\
--b\r\nContent-Type: text/plain\r\n\r\nFailed.\r\n\
--b\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mta.attacker.test\r\n\r\n{groups}\
--b\r\nContent-Type: text/rfc822-headers\r\n\r\nFrom: news@example.test\r\nSubject: Hello\r\nMessage-ID: {message_id}\r\n\r\n--b--\r\n"
    )
}

/// An ARF abuse report about `rcpt`, from `from`.
fn arf(from: &str, mail_from: &str, rcpt: &str, message_id: &str) -> String {
    format!(
        "From: {from}\r\nTo: fbl@example.test\r\nSubject: complaint\r\n\
MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=feedback-report; boundary=\"b\"\r\n\r\n\
--b\r\nContent-Type: text/plain\r\n\r\nThis is an abuse report.\r\n\
--b\r\nContent-Type: message/feedback-report\r\n\r\nFeedback-Type: abuse\r\nUser-Agent: troll/1.0\r\nVersion: 1\r\n\
Original-Mail-From: <{mail_from}>\r\nOriginal-Rcpt-To: <{rcpt}>\r\n\r\n\
--b\r\nContent-Type: message/rfc822\r\n\r\nFrom: news@example.test\r\nTo: {rcpt}\r\nSubject: Hello\r\nMessage-ID: {message_id}\r\n\r\nhi\r\n--b--\r\n"
    )
}

/// 40 recipients sent two campaigns by a real worker: `verp` (with a VERP
/// return path, id 1) and `plain` (without, id 2); and one recipient,
/// `unmailed@example.test`, on another list, never sent anything.
fn sent(kind: Kind) -> (tempfile::TempDir, Beanstalkd, ScriptedSmtp, Env) {
    let (tmp, bs, peer, env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.import_n("news", 40);
    let other = env.dir.path().join("other.csv");
    std::fs::write(&other, "email\nunmailed@example.test\n").unwrap();
    env.ok(&["import", other.to_str().unwrap(), "--list", "other"]);
    env.create_campaign(
        "verp",
        "news",
        &["--return-path", "bounces@bounce.example.test"],
    );
    env.create_campaign("plain", "news", &[]);
    env.ok(&["enqueue", "verp"]);
    env.ok(&["enqueue", "plain"]);
    let _w = env.worker(&[]);
    wait_for(60, "both campaigns sent", || {
        env.status("verp")["pending"] == 0 && env.status("plain")["pending"] == 0
    });
    (tmp, bs, peer, env)
}

/// The Message-ID of campaign `plain`'s message to `rcpt`, as it went out.
fn plain_message_id(peer: &ScriptedSmtp, rcpt: &str) -> String {
    let messages = peer.messages.lock().unwrap();
    let (_, text) = messages
        .iter()
        .find(|(to, text)| to.iter().any(|t| t == rcpt) && text.contains("Feedback-ID: plain:"))
        .unwrap_or_else(|| panic!("no message of campaign plain to {rcpt}"));
    header(text, "Message-ID")[0].clone()
}

fn everybody_active(env: &Env, what: &str) {
    let mut emails: Vec<String> = (1..=40).map(|i| format!("user{i}@example.test")).collect();
    emails.push("unmailed@example.test".into());
    for e in emails {
        assert_eq!(status_of(env, &e), RecipientStatus::Active, "{what}: {e}");
    }
    for c in ["verp", "plain"] {
        let s = env.status(c);
        assert_eq!(
            (s["bounced"].as_i64(), s["complaints"].as_i64()),
            (Some(0), Some(0)),
            "{what}: {s}"
        );
    }
    assert!(
        bounces::recent(&mut env.conn(), 100).unwrap().is_empty(),
        "{what}"
    );
}

fn forged_reports_change_nobody(kind: Kind) {
    let (_tmp, _bs, peer, env) = sent(kind);
    let db = env.identity().database_id;
    let plain = "bounces@bounce.example.test";
    // A DSN for an address no campaign ever mailed.
    let dsn = postfix_dsn(
        plain,
        "unmailed@example.test",
        "5.1.1",
        "550 5.1.1 unknown",
        "<x@y>",
    );
    let log = bounce(&env, &[plain], dsn.as_bytes());
    assert!(log.contains("unverified dsn report"), "{log}");
    everybody_active(&env, "an unmailed address");
    // A made-up VERP token.
    let made_up = "bounces+aaaaaaaaaaaaaaaaaaaaaaaaaa@bounce.example.test";
    let dsn = postfix_dsn(
        made_up,
        "user1@example.test",
        "5.1.1",
        "550 5.1.1 unknown",
        "<x@y>",
    );
    let log = bounce(&env, &[made_up], dsn.as_bytes());
    assert!(log.contains("VERP token is not one we made"), "{log}");
    everybody_active(&env, "a made-up token");
    // One DSN with 34 Final-Recipients: the log says so in one short line.
    let many: Vec<String> = (1..=34).map(|i| format!("user{i}@example.test")).collect();
    let log = bounce(&env, &[plain], dsn_many(plain, &many, "<z@y>").as_bytes());
    assert!(
        log.contains("naming 34 addresses") && log.contains("and 31 more"),
        "{log}"
    );
    everybody_active(&env, "34 Final-Recipients");
    // A troll's ARF about user2.
    let troll = arf(
        "troll@attacker.test",
        "troll@attacker.test",
        "user2@example.test",
        "<t@attacker.test>",
    );
    bounce(&env, &[], troll.as_bytes());
    everybody_active(&env, "a troll's ARF");
    // Six forged ARFs naming sequential Message-IDs of both campaigns.
    for i in 3..=8 {
        let email = format!("user{i}@example.test");
        let r = rid(&env, &email);
        let campaign = 1 + i % 2;
        let mid = format!("<{campaign}.{r}.{db}@example.test>");
        bounce(
            &env,
            &[],
            arf("fbl@isp.test", "news@example.test", &email, &mid).as_bytes(),
        );
    }
    everybody_active(&env, "forged sequential Message-IDs");
    let human = env.ok(&["status"]);
    assert!(human.contains("unverified reports: 10"), "{human}");
    assert!(!human.contains("OVER THE LIMIT"), "{human}");

    // Genuine: a VERP token names one recipient, however many the DSN lists.
    let token = env
        .identity()
        .signer
        .verp_token(1, rid(&env, "user35@example.test"));
    let verp = format!("bounces+{token}@bounce.example.test");
    bounce(&env, &[&verp], dsn_many(&verp, &many, "<z2@y>").as_bytes());
    assert_eq!(
        status_of(&env, "user35@example.test"),
        RecipientStatus::Bounced
    );
    assert_eq!(
        status_of(&env, "user1@example.test"),
        RecipientStatus::Active
    );
    assert_eq!(env.status("verp")["bounced"], 1);
    // Genuine, without VERP: real fixtures returning campaign plain's own
    // messages (a Postfix DSN, a Yahoo ARF), matched on the Message-ID.
    let fixtures = bounce_fixtures();
    let dsn = std::fs::read_to_string(fixtures.join("dsn-postfix-user-unknown.eml"))
        .unwrap()
        .replace("kijitora@example.co.jp", "user36@example.test")
        .replace(
            "<A8F82EDD-E518-4F5C-8C70-BC4EFF24AB9F@example.ne.jp>",
            &plain_message_id(&peer, "user36@example.test"),
        );
    bounce(&env, &[], dsn.as_bytes());
    assert_eq!(
        status_of(&env, "user36@example.test"),
        RecipientStatus::Bounced
    );
    let yahoo = std::fs::read_to_string(fixtures.join("arf-yahoo-abuse.eml"))
        .unwrap()
        .replace(
            "this-local-part-does-not-exist-on-yahoo@yahoo.com",
            "user37@example.test",
        )
        .replace(
            "<000000000000000000000000.smtp@example.com>",
            &plain_message_id(&peer, "user37@example.test"),
        );
    bounce(&env, &[], yahoo.as_bytes());
    assert_eq!(
        status_of(&env, "user37@example.test"),
        RecipientStatus::Unsubscribed
    );
    let s = env.status("plain");
    assert_eq!(
        (s["bounced"].as_i64(), s["complaints"].as_i64()),
        (Some(1), Some(1)),
        "{s}"
    );
}

/// A genuine Message-ID (signed by us) of a message the ledger never sent
/// changes nobody: the recipient was never mailed by that campaign.
#[test]
fn signed_message_id_of_an_unsent_message_changes_nobody() {
    let (_tmp, _bs, _peer, env) = sent(Kind::Sqlite);
    let unmailed = rid(&env, "unmailed@example.test");
    let mid = mailsplit::compose::message_id_of(&env.identity(), 2, unmailed, "example.test");
    let dsn = postfix_dsn(
        "news@example.test",
        "unmailed@example.test",
        "5.1.1",
        "550 5.1.1 no",
        &mid,
    );
    let log = bounce(&env, &[], dsn.as_bytes());
    assert!(log.contains("which the ledger never sent"), "{log}");
    assert_eq!(
        status_of(&env, "unmailed@example.test"),
        RecipientStatus::Active
    );
}

both!(forged_reports_change_nobody);
