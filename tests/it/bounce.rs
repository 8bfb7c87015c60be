//! `mailsplit bounce` and what flows back into the ledger: the 43 real
//! reports of the shared fixtures against their manifest, VERP return
//! paths made by real workers and read back, complaints, soft-bounce
//! counting, idempotency, exit 75 while the database is away, Maildir,
//! hard bounces at send time, suppression at claim time for every
//! campaign, and the webhook.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::util::*;
use mailsplit::store::bounces::{self, BounceKind};
use mailsplit::store::RecipientStatus;

/// Run `mailsplit bounce [args]` with `message` on stdin.
fn bounce(env: &Env, args: &[&str], message: &[u8]) -> Output {
    bounce_at(env, &env.db.url, args, message)
}

/// The same against the database at `url`.
fn bounce_at(env: &Env, url: &str, args: &[&str], message: &[u8]) -> Output {
    let mut all = vec!["bounce"];
    all.extend_from_slice(args);
    let mut child = env
        .cmd(&all)
        .env("DATABASE_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(message).unwrap();
    child.wait_with_output().unwrap()
}

fn bounce_ok(env: &Env, args: &[&str], message: &[u8]) -> String {
    let out = bounce(env, args, message);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stderr(&out)
}

fn recipient_id(env: &Env, email: &str) -> i64 {
    bounces::find_recipient(&mut env.conn(), email)
        .unwrap()
        .unwrap_or_else(|| panic!("no recipient {email}"))
        .0
}

fn status_of(env: &Env, email: &str) -> (RecipientStatus, Option<String>) {
    let id = recipient_id(env, email);
    bounces::status_of(&mut env.conn(), id).unwrap().unwrap()
}

/// The manifest's kind for one of our events: what the report says about
/// the delivery (permanent, temporary, warning, complaint, other feedback).
fn manifest_kind(kind: BounceKind, status: Option<&str>) -> &'static str {
    let permanent = status.is_none_or(|s| s.starts_with('5'));
    match kind {
        BounceKind::Complaint => "arf-abuse",
        BounceKind::Feedback => "arf-other",
        BounceKind::Delayed => "dsn-delayed",
        BounceKind::Hard => "dsn-hard",
        BounceKind::Soft | BounceKind::Policy if permanent => "dsn-hard",
        BounceKind::Soft | BounceKind::Policy => "dsn-soft",
    }
}

/// Our class of each fixture, where it is more than the manifest says:
/// mailbox full is soft even when permanent, refusals for the sender's
/// reputation are policy blocks, not bad addresses.
fn expected_class(file: &str, manifest: &str) -> Option<BounceKind> {
    Some(match (file, manifest) {
        ("dsn-postfix-mailbox-full-552.eml", _) => BounceKind::Soft,
        ("dsn-exim-rejected-rdns.eml", _) => BounceKind::Policy,
        ("dsn-postfix-yahoo-deferred-soft.eml", _) => BounceKind::Policy,
        (_, "dsn-hard") => BounceKind::Hard,
        (_, "dsn-soft") => BounceKind::Soft,
        (_, "dsn-delayed") => BounceKind::Delayed,
        (_, "arf-abuse") => BounceKind::Complaint,
        (_, "arf-other") => BounceKind::Feedback,
        _ => return None,
    })
}

fn fixtures_match_the_manifest(kind: Kind) {
    let dir = bounce_fixtures();
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).unwrap();
    let rows: Vec<Vec<&str>> = manifest
        .lines()
        .skip(1)
        .map(|l| l.split('\t').collect())
        .collect();
    assert_eq!(rows.len(), 43, "the manifest lists 43 messages");
    let env = Env::new(kind, "127.0.0.1:1");
    // Every address the manifest names is one of our recipients.
    let mut addresses = BTreeSet::new();
    for row in &rows {
        addresses.extend(row[3].split(',').filter(|a| !a.is_empty()));
    }
    let csv = env.dir.path().join("fixtures.csv");
    let mut text = String::from("email\n");
    for a in &addresses {
        text.push_str(&format!("{a}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", csv.to_str().unwrap(), "--list", "fixtures"]);

    let mut right = 0;
    let mut wrong = Vec::new();
    let mut reports = 0;
    for row in &rows {
        let (file, kind_in_manifest, expected) = (row[0], row[2], row[3]);
        let raw = std::fs::read(dir.join(file)).unwrap();
        // None of these reports is about a message we sent: each is
        // recorded as unverified and changes nobody.
        let log = bounce_ok(&env, &[], &raw);
        let report = mailsplit::bounce::report::parse(&raw);
        let new: Vec<&mailsplit::bounce::report::Finding> = report
            .findings
            .iter()
            .filter(|f| f.address.is_some())
            .collect();
        if !new.is_empty() {
            reports += 1;
            assert!(log.contains("unverified"), "{file}: {log}");
        }
        let got: BTreeSet<String> = new
            .iter()
            .filter_map(|f| f.address.as_deref())
            .map(str::to_lowercase)
            .collect();
        let want: BTreeSet<String> = expected
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_lowercase)
            .collect();
        let kinds_ok = new.iter().all(|e| {
            manifest_kind(e.kind, e.status.as_deref()) == kind_in_manifest
                && Some(e.kind) == expected_class(file, kind_in_manifest)
        });
        if got == want && kinds_ok {
            right += 1;
        } else {
            wrong.push(format!(
                "{file}: want {want:?} {kind_in_manifest}, got {new:?}"
            ));
        }
        // Never misfiled: whatever was recorded is about the right address
        // (an unplaceable report records nothing).
        assert!(got.is_subset(&want), "{file} misfiled: {new:?}");
    }
    assert!(bounces::recent(&mut env.conn(), 1_000).unwrap().is_empty());
    let (unverified, _) = mailsplit::store::unverified::recent(&mut env.conn(), 1).unwrap();
    assert_eq!(unverified, reports);
    println!("bounce fixtures: {right} of {} right", rows.len());
    assert!(
        wrong.is_empty(),
        "{right} of 43 right; wrong:\n{}",
        wrong.join("\n")
    );
}

/// A campaign with a VERP return path, sent by a real worker to the
/// scripted peer; returns the peer, which knows each message's envelope
/// sender.
fn sent_campaign(kind: Kind, n: usize) -> (tempfile::TempDir, Beanstalkd, ScriptedSmtp, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.import_n("news", n);
    env.create_campaign(
        "news",
        "news",
        &["--return-path", "Bounces@Bounce.Example.test"],
    );
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    (tmp, bs, peer, env)
}

fn verp_round_trip(kind: Kind) {
    let (_tmp, _bs, peer, env) = sent_campaign(kind, 5);
    // Each message went out with its own VERP envelope sender, lower-case,
    // within 64 octets, naming campaign and recipient; From is unchanged.
    let senders = peer.senders.lock().unwrap().clone();
    assert_eq!(senders.len(), 5);
    let identity = env.identity();
    for (rcpt, sender) in &senders {
        let (local, domain) = sender.split_once('@').unwrap();
        assert_eq!(domain, "bounce.example.test");
        assert!(
            local.starts_with("Bounces+") && local.len() <= 64,
            "{sender}"
        );
        let token = local.split_once('+').unwrap().1;
        assert_eq!(token, token.to_ascii_lowercase());
        let (c, r) = identity.signer.read_verp(token).unwrap();
        assert_eq!((c, r), (1, recipient_id(&env, rcpt)));
    }
    let verp = senders["user2@example.test"].clone();
    // Postfix lower-cases what it hands to the pipe; the token survives.
    let dsn = postfix_dsn(
        &verp.to_lowercase(),
        "user2@example.test",
        "5.1.1",
        "550 5.1.1 <user2@example.test>: Recipient address rejected: User unknown",
        "<1.2.mailsplit@example.test>",
    );
    bounce_ok(&env, &[&verp.to_lowercase()], dsn.as_bytes());
    let (status, reason) = status_of(&env, "user2@example.test");
    assert_eq!(status, RecipientStatus::Bounced);
    let reason = reason.unwrap();
    assert!(
        reason.contains("hard bounce") && reason.contains("5.1.1"),
        "{reason}"
    );
    let s = env.status("news");
    assert_eq!(
        (s["bounced"].as_i64(), s["complaints"].as_i64()),
        (Some(1), Some(0)),
        "{s}"
    );
    // Postfix retrying the same delivery: recorded once, counted once.
    bounce_ok(&env, &[&verp], dsn.as_bytes());
    assert_eq!(env.status("news")["bounced"], 1);
    let events =
        bounces::events_of(&mut env.conn(), recipient_id(&env, "user2@example.test")).unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].campaign_id, Some(1));

    // A complaint (ARF) whose Original-Mail-From is the VERP address of
    // user3: unsubscribed, with the reason, and counted for the campaign.
    let verp3 = senders["user3@example.test"].clone();
    let arf = format!(
        "From: feedback@arf.mail.example\r\nTo: fbl@example.test\r\nSubject: complaint\r\n\
MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=feedback-report; boundary=\"b\"\r\n\r\n\
--b\r\nContent-Type: text/plain\r\n\r\nThis is an abuse report.\r\n\
--b\r\nContent-Type: message/feedback-report\r\n\r\nFeedback-Type: abuse\r\nUser-Agent: test/1.0\r\nVersion: 1\r\n\
Original-Mail-From: <{verp3}>\r\nOriginal-Rcpt-To: <someone-else@forwarded.example>\r\n\r\n\
--b\r\nContent-Type: message/rfc822\r\n\r\nFrom: news@example.test\r\nTo: user3@example.test\r\nSubject: Hello\r\n\r\nhi\r\n--b--\r\n"
    );
    bounce_ok(&env, &[], arf.as_bytes());
    let (status, reason) = status_of(&env, "user3@example.test");
    assert_eq!(status, RecipientStatus::Unsubscribed);
    assert!(reason.unwrap().contains("complaint"));
    let s = env.status("news");
    assert_eq!(s["complaints"], 1, "{s}");
    assert!(
        (s["complaint_rate"].as_f64().unwrap() - 0.2).abs() < 1e-9,
        "{s}"
    );
    let human = env.ok(&["status", "news"]);
    assert!(
        human.contains("complaints 1 (20.00 % of sent; limit 0.3 % OVER THE LIMIT"),
        "{human}"
    );

    // A forged token is no token: the report changes nobody (it is
    // recorded as unverified), whatever address it names.
    let forged = "bounces+aaaaaaaaaaaaaaaaaaaaaaaa@bounce.example.test";
    let dsn = postfix_dsn(
        forged,
        "user4@example.test",
        "5.1.1",
        "550 5.1.1 unknown",
        "<x@y>",
    );
    assert!(bounce_ok(&env, &[forged], dsn.as_bytes()).contains("unverified"));
    let events =
        bounces::events_of(&mut env.conn(), recipient_id(&env, "user4@example.test")).unwrap();
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(
        status_of(&env, "user4@example.test").0,
        RecipientStatus::Active
    );
    assert_eq!(env.status("news")["bounced"], 1);
}

#[test]
fn soft_bounces_add_up_within_the_window() {
    let (_tmp, _bs, peer, env) = sent_campaign(Kind::Sqlite, 3);
    let verp = |email: &str| peer.senders.lock().unwrap()[email].clone();
    for n in 1..=3 {
        // Three different reports (a full mailbox, a timeout, a full one).
        let status = if n == 2 { "4.4.1" } else { "4.2.2" };
        let dsn = postfix_dsn(
            &verp("user1@example.test"),
            "user1@example.test",
            status,
            &format!("452 {status} try {n}"),
            &format!("<m{n}@elsewhere>"),
        );
        bounce_ok(&env, &["--soft-limit", "3"], dsn.as_bytes());
        let (status, reason) = status_of(&env, "user1@example.test");
        if n < 3 {
            assert_eq!(status, RecipientStatus::Active, "after {n}");
        } else {
            assert_eq!(status, RecipientStatus::Bounced);
            assert!(reason.unwrap().contains("3 soft bounces within 14 days"));
        }
    }
    // Delay warnings and policy blocks never bounce anybody.
    for (n, status, diag) in [
        (1, "4.4.7", "delayed: still trying"),
        (2, "5.7.1", "554 5.7.1 spam"),
        (3, "5.7.26", "550 5.7.26 DMARC"),
    ] {
        let dsn = postfix_dsn(
            &verp("user2@example.test"),
            "user2@example.test",
            status,
            diag,
            &format!("<p{n}@x>"),
        );
        bounce_ok(&env, &["--soft-limit", "1"], dsn.as_bytes());
    }
    assert_eq!(
        status_of(&env, "user2@example.test").0,
        RecipientStatus::Active
    );
    let kinds: Vec<BounceKind> =
        bounces::events_of(&mut env.conn(), recipient_id(&env, "user2@example.test"))
            .unwrap()
            .iter()
            .map(|e| e.kind)
            .collect();
    assert_eq!(
        kinds,
        [BounceKind::Delayed, BounceKind::Policy, BounceKind::Policy]
    );
}

#[test]
fn unreadable_database_exits_75_and_leaks_no_password() {
    let env = Env::empty(Kind::Sqlite, "127.0.0.1:1");
    let dsn = postfix_dsn(
        "b@b.test",
        "user1@example.test",
        "5.1.1",
        "550 5.1.1 no",
        "<x@y>",
    );
    for url in [
        format!(
            "postgres://mailsplit:s3cretpw@127.0.0.1:{}/nodb",
            free_port()
        ),
        "sqlite:///nonexistent-dir/sub/mailsplit.db".to_string(),
    ] {
        let out = bounce_at(&env, &url, &[], dsn.as_bytes());
        assert_eq!(out.status.code(), Some(75), "{url}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("try again later"), "{err}");
        assert!(!err.contains("s3cretpw"), "{err}");
    }
    // A database without the schema is a configuration to fix, not a
    // reason to lose the report: 75 too.
    let out = bounce(&env, &[], dsn.as_bytes());
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("mailsplit migrate"));
}

#[test]
fn ordinary_mail_and_strangers_are_ignored() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.import_n("news", 2);
    let dir = bounce_fixtures();
    for file in [
        "notbounce-vacation.eml",
        "notbounce-exchange-auto-reply.eml",
        "notbounce-forwarded-attachment.eml",
    ] {
        let err = bounce_ok(
            &env,
            &["bounces+zzz@bounce.example.test"],
            &std::fs::read(dir.join(file)).unwrap(),
        );
        assert!(err.contains("ignored: not a bounce"), "{file}: {err}");
    }
    // A real report about somebody we never mailed.
    let dsn = postfix_dsn(
        "b@b.test",
        "stranger@elsewhere.test",
        "5.1.1",
        "550 5.1.1 no",
        "<x@y>",
    );
    assert!(bounce_ok(&env, &[], dsn.as_bytes()).contains("unverified dsn report"));
    // Garbage, an empty message, a huge one: exit 0, nothing recorded.
    bounce_ok(&env, &[], b"");
    bounce_ok(&env, &[], b"\x00\x01\x02 not mail at all \xff\xfe");
    let mut huge = dsn.clone().into_bytes();
    huge.extend(std::iter::repeat_n(b'x', 20 << 20));
    bounce_ok(&env, &[], &huge);
    assert!(bounces::recent(&mut env.conn(), 10).unwrap().is_empty());
}

#[test]
fn maildir_moves_what_it_handled() {
    let (_tmp, _bs, peer, env) = sent_campaign(Kind::Sqlite, 3);
    let verp = |email: &str| peer.senders.lock().unwrap()[email].clone();
    let md = env.dir.path().join("Maildir");
    for sub in ["new", "cur", "tmp"] {
        std::fs::create_dir_all(md.join(sub)).unwrap();
    }
    let dsn = postfix_dsn(
        &verp("user1@example.test"),
        "user1@example.test",
        "5.1.1",
        "550 5.1.1 no",
        "<x@y>",
    );
    std::fs::write(md.join("new/1.dsn"), &dsn).unwrap();
    std::fs::copy(
        bounce_fixtures().join("notbounce-vacation.eml"),
        md.join("new/2.vacation"),
    )
    .unwrap();
    std::fs::write(
        md.join("new/3.seen:2,F"),
        postfix_dsn(
            &verp("user2@example.test"),
            "user2@example.test",
            "5.1.2",
            "550 5.1.2 no domain",
            "<z@y>",
        ),
    )
    .unwrap();
    // Database away: exit 75, every file stays in new/.
    let out = env
        .cmd(&["bounce", "--maildir", md.to_str().unwrap()])
        .env("DATABASE_URL", "sqlite:///nonexistent-dir/x.db")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75));
    assert_eq!(std::fs::read_dir(md.join("new")).unwrap().count(), 3);
    let out = env.ok(&["bounce", "--maildir", md.to_str().unwrap()]);
    assert!(
        out.contains("2 reports recorded, 0 unverified, 1 messages ignored"),
        "{out}"
    );
    assert_eq!(std::fs::read_dir(md.join("new")).unwrap().count(), 0);
    let mut cur: Vec<String> = std::fs::read_dir(md.join("cur"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    cur.sort();
    assert_eq!(cur, ["1.dsn:2,S", "2.vacation:2,S", "3.seen:2,FS"]);
    assert_eq!(
        status_of(&env, "user1@example.test").0,
        RecipientStatus::Bounced
    );
    assert_eq!(
        status_of(&env, "user2@example.test").0,
        RecipientStatus::Bounced
    );
    assert_eq!(
        status_of(&env, "user3@example.test").0,
        RecipientStatus::Active
    );
}

/// 5.1.x at send time makes the recipient bounced for every campaign;
/// 5.7.x (a policy block) fails the delivery and leaves the address alone.
fn send_time_refusals(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let hard = ScriptedSmtp::start(Script {
        reject: Some("user3@".into()),
        ..Script::default()
    });
    let policy = ScriptedSmtp::start(Script {
        reject: Some("user4@".into()),
        reject_reply: Some("554 5.7.1 Service unavailable; client host blocked".into()),
        ..Script::default()
    });
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = hard.url();
    env.import_n("news", 6);
    env.create_campaign("first", "news", &[]);
    env.ok(&["enqueue", "first"]);
    {
        let _w = env.worker(&[]);
        wait_done(&env, "first", 60);
    }
    let s = env.status("first");
    assert_eq!(
        (
            s["sent"].as_i64(),
            s["failed"].as_i64(),
            s["bounced"].as_i64()
        ),
        (Some(5), Some(1), Some(1)),
        "{s}"
    );
    let (status, reason) = status_of(&env, "user3@example.test");
    assert_eq!(status, RecipientStatus::Bounced);
    assert!(reason.unwrap().contains("550 5.1.1"));
    // The second campaign, through a relay that blocks user4 by policy.
    env.smtp = policy.url();
    env.create_campaign("second", "news", &[]);
    env.ok(&["enqueue", "second"]);
    {
        let _w = env.worker(&[]);
        wait_done(&env, "second", 60);
    }
    let s = env.status("second");
    assert_eq!(
        (
            s["sent"].as_i64(),
            s["failed"].as_i64(),
            s["skipped"].as_i64(),
            s["bounced"].as_i64()
        ),
        (Some(4), Some(1), Some(1), Some(0)),
        "{s}"
    );
    assert_eq!(policy.tries.lock().unwrap().get("user3@example.test"), None);
    assert_eq!(
        status_of(&env, "user4@example.test").0,
        RecipientStatus::Active
    );
}

/// A recipient who bounces after a campaign was enqueued is skipped by it
/// at claim time, and by every later one.
fn suppressed_at_claim_time(kind: Kind) {
    let (_tmp, _bs, peer, env) = sent_campaign(kind, 4);
    env.create_campaign("later", "news", &[]);
    env.ok(&["enqueue", "later"]);
    let verp = |email: &str| peer.senders.lock().unwrap()[email].clone();
    let dsn = postfix_dsn(
        &verp("user1@example.test"),
        "user1@example.test",
        "5.1.1",
        "550 5.1.1 no",
        "<1.x.mailsplit@example.test>",
    );
    bounce_ok(&env, &[], dsn.as_bytes());
    let arf = std::fs::read_to_string(bounce_fixtures().join("arf-yahoo-abuse.eml"))
        .unwrap()
        .replace(
            "this-local-part-does-not-exist-on-yahoo@yahoo.com",
            "user2@example.test",
        )
        // The reported message's envelope sender: our VERP address.
        .replace("shironeko@example.com", &verp("user2@example.test"));
    bounce_ok(&env, &[], arf.as_bytes());
    let _w = env.worker(&[]);
    wait_done(&env, "later", 60);
    let s = env.status("later");
    assert_eq!(
        (s["sent"].as_i64(), s["skipped"].as_i64()),
        (Some(2), Some(2)),
        "{s}"
    );
    assert_eq!(peer.count("user1@example.test"), 1);
    assert_eq!(peer.count("user2@example.test"), 1);
    assert_eq!(peer.count("user3@example.test"), 2);
}

#[test]
fn bad_return_paths_are_usage_errors() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.import_n("news", 1);
    for bad in [
        "bounces+x@bounce.test",
        "not an address",
        &format!("{}@b.test", "l".repeat(40)),
    ] {
        let out = env.try_create_campaign("c", "news", &["--return-path", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("return path"), "{}", stderr(&out));
    }
    let out = env.try_create_campaign("c", "news", &["--max-failure-rate", "150%"]);
    assert_eq!(out.status.code(), Some(2));
    // From the environment too.
    let out = env
        .cmd(&[
            "campaign",
            "create",
            "c",
            "--list",
            "news",
            "--template",
            "newsletter",
            "--subject",
            "s",
            "--from",
            "a@b.test",
        ])
        .env("MAILSPLIT_RETURN_PATH", "bounces@b.test")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let c = mailsplit::store::campaigns::find(&mut env.conn(), "c").unwrap();
    assert_eq!(c.return_path.as_deref(), Some("bounces@b.test"));
    assert_eq!(c.max_failure_rate, Some(0.2));
}

/// The webhook on `serve`'s public listener.
fn webhook(env: &Env, token: Option<&str>) -> (Proc, u16) {
    let (public, admin) = (free_port(), free_port());
    let mut cmd = env.cmd(&[
        "serve",
        "--listen",
        &format!("127.0.0.1:{public}"),
        "--admin-listen",
        &format!("127.0.0.1:{admin}"),
    ]);
    cmd.env_remove("MAILSPLIT_WEBHOOK_TOKEN")
        .stderr(Stdio::null());
    if let Some(t) = token {
        cmd.env("MAILSPLIT_WEBHOOK_TOKEN", t);
    }
    let proc = Proc(cmd.spawn().unwrap());
    wait_port(public);
    (proc, public)
}

fn post(port: u16, body: &str, token: Option<&str>) -> (u16, String) {
    let mut req = ureq::post(&format!("http://127.0.0.1:{port}/webhooks/bounce"))
        .timeout(Duration::from_secs(10))
        .set("Content-Type", "application/json");
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    match req.send_string(body) {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("POST: {e}"),
    }
}

fn webhook_records_events(kind: Kind) {
    let (_tmp, _bs, peer, env) = sent_campaign(kind, 4);
    // Without a token there is no route at all.
    {
        let (_p, port) = webhook(&env, None);
        assert_eq!(
            post(
                port,
                r#"{"email":"user1@example.test","type":"hard"}"#,
                None
            )
            .0,
            404
        );
    }
    let (_p, port) = webhook(&env, Some("hook-s3cret"));
    for token in [None, Some("wrong"), Some("hook-s3cre")] {
        let (code, _) = post(
            port,
            r#"{"email":"user1@example.test","type":"hard"}"#,
            token,
        );
        assert_eq!(code, 401, "{token:?}");
    }
    assert_eq!(
        status_of(&env, "user1@example.test").0,
        RecipientStatus::Active
    );
    let t = Some("hook-s3cret");
    // By address.
    let (code, body) = post(
        port,
        r#"{"email":"user1@example.test","type":"hard","reason":"550 5.1.1 gone"}"#,
        t,
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        status_of(&env, "user1@example.test").0,
        RecipientStatus::Bounced
    );
    // By VERP token: the campaign is credited.
    let verp = peer.senders.lock().unwrap()["user2@example.test"].clone();
    let token = verp.split(['+', '@']).nth(1).unwrap().to_string();
    let (code, body) = post(
        port,
        &format!(r#"{{"token":"{token}","type":"complaint","reason":"fbl"}}"#),
        t,
    );
    assert_eq!(code, 200, "{body}");
    let (status, reason) = status_of(&env, "user2@example.test");
    assert_eq!(status, RecipientStatus::Unsubscribed);
    assert!(reason.unwrap().contains("complaint"));
    assert_eq!(env.status("news")["complaints"], 1);
    // The same call again (a provider retrying): recorded once.
    post(
        port,
        &format!(r#"{{"token":"{token}","type":"complaint","reason":"fbl"}}"#),
        t,
    );
    assert_eq!(env.status("news")["complaints"], 1);
    // Soft: counted, not yet bounced.
    assert_eq!(
        post(port, r#"{"email":"user3@example.test","type":"soft"}"#, t).0,
        200
    );
    assert_eq!(
        status_of(&env, "user3@example.test").0,
        RecipientStatus::Active
    );
    // Bad input: clear errors, nothing recorded.
    for (body, code) in [
        ("not json", 400),
        (r#"{"email":"user4@example.test","type":"bogus"}"#, 422),
        (r#"{"type":"hard"}"#, 422),
        (r#"{"email":"nobody@example.test","type":"hard"}"#, 404),
        (r#"{"token":"aaaaaaaaaaaaaaaaaaaaaaa","type":"hard"}"#, 404),
    ] {
        assert_eq!(post(port, body, t).0, code, "{body}");
    }
    assert_eq!(
        status_of(&env, "user4@example.test").0,
        RecipientStatus::Active
    );
}

/// The events of a whole table as (email, kind) pairs.
fn all_events(env: &Env) -> BTreeMap<String, Vec<BounceKind>> {
    let mut out: BTreeMap<String, Vec<BounceKind>> = BTreeMap::new();
    for e in bounces::recent(&mut env.conn(), 10_000).unwrap() {
        out.entry(e.email).or_default().push(e.kind);
    }
    out
}

#[test]
fn concurrent_deliveries_of_one_report_count_once() {
    let (_tmp, _bs, peer, env) = sent_campaign(Kind::Postgres, 3);
    let verp = peer.senders.lock().unwrap()["user1@example.test"].clone();
    let dsn = postfix_dsn(
        &verp,
        "user1@example.test",
        "5.1.1",
        "550 5.1.1 no",
        "<a@b>",
    );
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| bounce_ok(&env, &[&verp], dsn.as_bytes()));
        }
    });
    assert_eq!(all_events(&env)["user1@example.test"], [BounceKind::Hard]);
    assert_eq!(env.status("news")["bounced"], 1);
}

both!(
    fixtures_match_the_manifest,
    verp_round_trip,
    send_time_refusals,
    suppressed_at_claim_time,
    webhook_records_events
);
