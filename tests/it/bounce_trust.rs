//! Trust: only what we wrote changes anybody. Forged bounces and
//! complaints (an unmailed address, a made-up VERP token, one DSN naming
//! 34 recipients, a troll's ARF, forged sequential Message-IDs) change
//! nobody and are recorded as unverified; genuine reports (by VERP token,
//! by our signed Message-ID, real fixtures) still work.

use std::io::Write;
use std::process::{Output, Stdio};

use crate::util::*;
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

/// `serve` with these tokens on these addresses; its log goes to a file.
fn serve_logged(
    env: &Env,
    admin_ip: &str,
    admin_token: Option<&str>,
    webhook_token: Option<&str>,
) -> (std::process::Command, u16, u16, std::path::PathBuf) {
    let (public, admin) = (free_port(), free_port());
    let mut cmd = env.cmd(&[
        "serve",
        "--listen",
        &format!("127.0.0.1:{public}"),
        "--admin-listen",
        &format!("{admin_ip}:{admin}"),
    ]);
    cmd.env_remove("MAILSPLIT_ADMIN_TOKEN")
        .env_remove("MAILSPLIT_WEBHOOK_TOKEN");
    if let Some(t) = admin_token {
        cmd.env("MAILSPLIT_ADMIN_TOKEN", t);
    }
    if let Some(t) = webhook_token {
        cmd.env("MAILSPLIT_WEBHOOK_TOKEN", t);
    }
    let log = env.dir.path().join(format!("serve-{admin}.log"));
    cmd.stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    (cmd, public, admin, log)
}

const STRONG: &str = "kQ7vX2pLm9RtYw4ZsB8nHc3J";

/// Weak admin tokens on a non-loopback listener, and tokens with spaces
/// around them, are refused at start (exit 2, without echoing the token).
#[test]
fn weak_or_spaced_tokens_are_refused_at_start() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    for (ip, admin, webhook, why) in [
        ("0.0.0.0", Some("x"), None, "too weak"),
        (
            "0.0.0.0",
            Some("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
            None,
            "too weak",
        ),
        (
            "0.0.0.0",
            Some("abcdefghijklmnopqrstuvwxyz"),
            None,
            "too weak",
        ),
        (
            "127.0.0.1",
            Some(" kQ7vX2pLm9RtYw4ZsB8nHc3J "),
            None,
            "spaces",
        ),
        ("127.0.0.1", None, Some("hook-s3cret\n"), "spaces"),
    ] {
        let (mut cmd, _, _, log) = serve_logged(&env, ip, admin, webhook);
        let status = cmd.status().unwrap();
        let err = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(2), "{admin:?} {webhook:?}: {err}");
        assert!(err.contains(why), "{err}");
        for t in [admin, webhook].into_iter().flatten() {
            assert!(!err.contains(t.trim()), "the token leaked: {err}");
        }
    }
    // A strong one on a non-loopback address starts.
    let (mut cmd, _, admin, _) = serve_logged(&env, "0.0.0.0", Some(STRONG), None);
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(admin);
}

/// Ten wrong tokens a minute per client, then 429 for every wrong one;
/// the right token still gets in from that address (bearer header and
/// login form), also after twenty; every failure is logged with the
/// client's address and never the token.
#[test]
fn failed_logins_are_limited_and_logged_per_client() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let hook = "Wh7kP2qZx9LmR4tV8sNc3bYd";
    let (mut cmd, public, admin, log) = serve_logged(&env, "127.0.0.1", Some(STRONG), Some(hook));
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(public);
    wait_port(admin);
    let ok = format!("Bearer {STRONG}");
    let api = |auth: &str| {
        http(
            "GET",
            admin,
            "/api/campaigns",
            &[("Authorization", auth)],
            None,
        )
    };
    assert_eq!(api(&ok).status, 200);
    for i in 0..20 {
        let r = api(&format!("Bearer guess-number-{i}"));
        let expected = if i < 10 { 401 } else { 429 };
        assert_eq!(r.status, expected, "try {i}: {}", r.body);
        if i >= 10 {
            assert!(r.header("retry-after").is_some());
        }
    }
    // The right token is never locked out, whatever the address sent.
    let r = api(&ok);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(api("Bearer yet-another-guess").status, 429);
    // The login form with the right token too; a wrong one gets 429.
    let r = http(
        "POST",
        admin,
        "/login",
        &[],
        Some(&format!("token={STRONG}")),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let r = http("POST", admin, "/login", &[], Some("token=wrong-again"));
    assert_eq!(r.status, 429);
    // The webhook is on the public listener, with its own token, but the
    // same client: a wrong one is refused as well, the right one taken.
    let body = Some(r#"{"email":"a@b.test","type":"hard"}"#);
    let hook_call = |auth: &str| {
        let headers = [
            ("Content-Type", "application/json"),
            ("Authorization", auth),
        ];
        http("POST", public, "/webhooks/bounce", &headers, body)
    };
    assert_eq!(hook_call("Bearer nope").status, 429);
    let r = hook_call(&format!("Bearer {hook}"));
    assert!(![401, 429].contains(&r.status), "{}: {}", r.status, r.body);
    let text = std::fs::read_to_string(&log).unwrap();
    let failures: Vec<&str> = text.lines().filter(|l| l.contains("wrong token")).collect();
    assert_eq!(failures.len(), 10, "{text}");
    assert!(
        failures.iter().all(|l| l.contains("client=127.0.0.1")),
        "{text}"
    );
    assert!(!text.contains("guess-number"), "a token was logged: {text}");
    assert!(text.contains("too many failed attempts"), "{text}");
}

/// Behind a trusted proxy, `X-Forwarded-For` tells clients apart: one
/// client's failures lock out neither another client nor the right token;
/// from a peer that is not a trusted proxy the header is ignored.
#[test]
fn forwarded_clients_are_counted_apart_only_behind_a_trusted_proxy() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let bad = |admin: u16, client: &str, token: &str| {
        let auth = format!("Bearer {token}");
        http(
            "GET",
            admin,
            "/api/campaigns",
            &[("Authorization", &auth), ("X-Forwarded-For", client)],
            None,
        )
        .status
    };
    // The tests' peer, 127.0.0.1, is the trusted proxy.
    let (mut cmd, _, admin, log) = serve_logged(&env, "127.0.0.1", Some(STRONG), None);
    cmd.args(["--trusted-proxy", "10.9.9.9,127.0.0.1"]);
    let p = Proc(cmd.spawn().unwrap());
    wait_port(admin);
    // A client can put anything left of what the proxy appended.
    let one = "198.51.100.1, 203.0.113.1";
    for i in 0..10 {
        assert_eq!(bad(admin, one, &format!("aaaa-{i}")), 401, "try {i}");
    }
    assert_eq!(bad(admin, one, "bbbb"), 429);
    assert_eq!(bad(admin, "203.0.113.1", "cccc"), 429);
    // Another client behind the same proxy is not locked out.
    assert_eq!(bad(admin, "203.0.113.2", "dddd"), 401);
    assert_eq!(bad(admin, "203.0.113.2", STRONG), 200);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("client=203.0.113.1"), "{text}");
    assert!(text.contains("client=203.0.113.2"), "{text}");
    assert!(!text.contains("client=198.51.100.1"), "{text}");
    drop(p);

    // The peer is not a trusted proxy: every request is the peer's.
    let (mut cmd, _, admin, log) = serve_logged(&env, "127.0.0.1", Some(STRONG), None);
    cmd.args(["--trusted-proxy", "10.9.9.9"]);
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(admin);
    for i in 0..10 {
        let client = format!("203.0.113.{i}");
        assert_eq!(bad(admin, &client, &format!("eeee-{i}")), 401, "try {i}");
    }
    assert_eq!(bad(admin, "203.0.113.99", "ffff"), 429);
    assert_eq!(bad(admin, "203.0.113.99", STRONG), 200);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("client=127.0.0.1"), "{text}");
    assert!(!text.contains("client=203.0.113"), "{text}");
}

/// A failed webhook call is logged with the client address, not the token.
#[test]
fn failed_webhook_calls_are_logged_with_the_client() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let (mut cmd, public, _, log) =
        serve_logged(&env, "127.0.0.1", None, Some("Wh7kP2qZx9LmR4tV8sNc3bYd"));
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(public);
    let json = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer s3cret-guess"),
    ];
    let r = http(
        "POST",
        public,
        "/webhooks/bounce",
        &json,
        Some(r#"{"email":"a@b.test","type":"hard"}"#),
    );
    assert_eq!(r.status, 401);
    wait_for(10, "the failure logged", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("webhook bearer header: wrong token")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("client=127.0.0.1"), "{text}");
    assert!(!text.contains("s3cret-guess"), "{text}");
}

/// An admin action's log line names the client that asked for it.
#[test]
fn admin_actions_are_logged_with_the_client() {
    let env = World::new(Kind::Sqlite);
    env.campaign("news", 3);
    let (mut cmd, _, admin, log) = serve_logged(&env, "127.0.0.1", Some(STRONG), None);
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(admin);
    let auth = format!("Bearer {STRONG}");
    let r = http(
        "POST",
        admin,
        "/api/campaigns/news/pause",
        &[("Authorization", &auth)],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    wait_for(10, "the action logged", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("campaign controlled")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("campaign controlled"))
        .unwrap();
    assert!(
        line.contains("client=127.0.0.1") && line.contains("news"),
        "{line}"
    );
}

/// The `s=` selectors of a message's DKIM signatures.
fn selectors(text: &str) -> Vec<String> {
    header(text, "DKIM-Signature")
        .iter()
        .filter_map(|sig| {
            sig.split(';')
                .map(str::trim)
                .find_map(|t| t.strip_prefix("s="))
                .map(str::to_string)
        })
        .collect()
}

/// `dkim delete` while a worker is sending stops the signing within
/// seconds, without a restart; a new key is used as quickly.
#[test]
fn dkim_delete_stops_signing_while_a_worker_runs() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            keep_data: true,
            data_delay: std::time::Duration::from_millis(50),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.import_n("news", 2_000);
    env.ok(&["dkim", "keygen", "example.test", "--selector", "leaked"]);
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&["--concurrency", "2"]);
    let count = || peer.messages.lock().unwrap().len();
    wait_for(30, "a few signed messages", || count() >= 5);
    assert_eq!(selectors(&peer.messages.lock().unwrap()[0].1), ["leaked"]);
    env.ok(&["dkim", "delete", "example.test"]);
    let deleted_at = count();
    // Within seconds (not at the end of the campaign or a restart).
    wait_for(5, "an unsigned message", || {
        peer.messages.lock().unwrap()[deleted_at..]
            .iter()
            .any(|(_, text)| selectors(text).is_empty())
    });
    let first_unsigned = {
        let m = peer.messages.lock().unwrap();
        (deleted_at..m.len())
            .find(|&i| selectors(&m[i].1).is_empty())
            .unwrap()
    };
    wait_for(10, "more messages", || count() > first_unsigned + 20);
    {
        let m = peer.messages.lock().unwrap();
        // Once the deletion is seen, the leaked key signs nothing more
        // (the two sessions may each have one composed message in hand).
        let late_signed = m[first_unsigned..]
            .iter()
            .filter(|(_, text)| !selectors(text).is_empty())
            .count();
        assert!(late_signed <= 2, "{late_signed} signed after the deletion");
    }
    env.ok(&["dkim", "keygen", "example.test", "--selector", "fresh"]);
    let added_at = count();
    wait_for(5, "a message signed with the new key", || {
        peer.messages.lock().unwrap()[added_at..]
            .iter()
            .any(|(_, text)| selectors(text) == ["fresh"])
    });
    env.ok(&["cancel", "news"]);
}

/// Webhook replays that differ only in whitespace (or key order) are the
/// same event; the provider's event id, when given, names it.
#[test]
fn webhook_replays_are_deduplicated_on_the_parsed_event() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.import_n("news", 2);
    let hook = "Wh7kP2qZx9LmR4tV8sNc3bYd";
    let (mut cmd, public, _, _) = serve_logged(&env, "127.0.0.1", None, Some(hook));
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(public);
    let auth = format!("Bearer {hook}");
    let post = |body: &str| {
        let h = [
            ("Content-Type", "application/json"),
            ("Authorization", auth.as_str()),
        ];
        let r = http("POST", public, "/webhooks/bounce", &h, Some(body));
        assert_eq!(r.status, 200, "{body}: {}", r.body);
    };
    let events = |email: &str| {
        bounces::events_of(&mut env.conn(), rid(&env, email))
            .unwrap()
            .len()
    };
    // Three "identical" soft bounces (the soft limit is 3).
    post(r#"{"email":"user1@example.test","type":"soft","reason":"452 full"}"#);
    post(
        "{ \"email\" : \"user1@example.test\",\n  \"type\": \"soft\", \"reason\": \"452 full\" }\n",
    );
    post(r#"{"type":"soft","reason":"452  full","email":"User1@example.test"}"#);
    assert_eq!(events("user1@example.test"), 1);
    assert_eq!(
        status_of(&env, "user1@example.test"),
        RecipientStatus::Active
    );
    // With provider ids: the same id is one event whatever else differs;
    // three ids are three events, and three soft bounces bounce.
    post(r#"{"id":"evt-1","email":"user2@example.test","type":"soft","reason":"a"}"#);
    post(r#"{"id":"evt-1","email":"user2@example.test","type":"soft","reason":"a (retry)"}"#);
    assert_eq!(events("user2@example.test"), 1);
    post(r#"{"id":"evt-2","email":"user2@example.test","type":"soft","reason":"a"}"#);
    post(r#"{"id":"evt-3","email":"user2@example.test","type":"soft","reason":"a"}"#);
    assert_eq!(events("user2@example.test"), 3);
    assert_eq!(
        status_of(&env, "user2@example.test"),
        RecipientStatus::Bounced
    );
}

/// `pause` on a draft is refused (CLI and API), and the dashboard offers
/// no Pause button for it.
#[test]
fn a_draft_cannot_be_paused() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.campaign_without_enqueue("draft1", 2);
    let out = env.run(&["pause", "draft1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("draft"), "{}", stderr(&out));
    let (mut cmd, _, admin, _) = serve_logged(&env, "127.0.0.1", Some(STRONG), None);
    let _p = Proc(cmd.spawn().unwrap());
    wait_port(admin);
    let auth = format!("Bearer {STRONG}");
    let r = http(
        "POST",
        admin,
        "/api/campaigns/draft1/pause",
        &[("Authorization", &auth)],
        None,
    );
    assert_eq!(r.status, 409, "{}", r.body);
    let page = http("GET", admin, "/live", &[("Authorization", &auth)], None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("draft1"), "{}", page.body);
    assert!(
        !page.body.contains("/campaigns/draft1/pause"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("/campaigns/draft1/cancel"),
        "{}",
        page.body
    );
    assert_eq!(env.status("draft1")["state"], "draft");
}

/// A return path on another organisation than From gets a warning about
/// SPF/DMARC alignment, like the missing-DKIM one; an aligned one none.
#[test]
fn an_unaligned_return_path_is_warned_about() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.import_n("news", 1);
    let out = env.try_create_campaign("a", "news", &["--return-path", "bounces@bounce.other.test"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: the return path's domain bounce.other.test")
            && err.contains("DMARC"),
        "{err}"
    );
    let out = env.try_create_campaign(
        "b",
        "news",
        &["--return-path", "bounces@bounce.example.test"],
    );
    assert!(out.status.success());
    assert!(!stderr(&out).contains("return path"), "{}", stderr(&out));
}

/// A DSN naming 100,000 addresses is logged as one short summary, not a
/// line of every address.
#[test]
fn a_dsn_naming_100000_addresses_is_logged_as_a_summary() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.import_n("news", 2);
    let many: Vec<String> = (0..100_000)
        .map(|i| format!("victim{i}@example.test"))
        .collect();
    let dsn = dsn_many("bounces@bounce.example.test", &many, "<m@x>");
    let log = bounce(&env, &[], dsn.as_bytes());
    assert!(log.len() < 2_000, "{} bytes of log", log.len());
    assert!(
        log.contains("naming 100000 addresses") && log.contains("and 99997 more"),
        "{log}"
    );
    assert!(bounces::recent(&mut env.conn(), 10).unwrap().is_empty());
}
