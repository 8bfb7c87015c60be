//! What goes on the wire and what a database holds: display names that
//! spam filters do not score, header lines within RFC 5322's limit whatever
//! the user typed, a database from a newer binary refused, and two
//! databases sharing one tube without 30-second releases. Messages are captured at a scripted SMTP peer.

use std::process::Command;

use crate::dkim::{dkimpy, txt_record};
use crate::util::{header, stderr, stdout, wait_for, Beanstalkd, Env, Kind, Script, ScriptedSmtp};

/// A beanstalkd, a peer keeping every message, and an environment (migrated)
/// pointing at both.
fn capturing(kind: Kind) -> (tempfile::TempDir, Beanstalkd, ScriptedSmtp, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        keep_data: true,
        ..Script::default()
    });
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.ok(&["migrate"]);
    (tmp, bs, peer, env)
}

/// The messages the peer accepted, SMTP's dot-stuffing undone.
fn captured(peer: &ScriptedSmtp) -> Vec<String> {
    peer.messages
        .lock()
        .unwrap()
        .iter()
        .map(|(_, text)| {
            text.split_inclusive("\r\n")
                .map(|l| {
                    l.strip_prefix('.')
                        .filter(|r| r.starts_with('.'))
                        .unwrap_or(l)
                })
                .collect()
        })
        .collect()
}

/// `campaign create NAME` with every option spelled out.
fn create(env: &Env, name: &str, list: &str, template: &str, subject: &str, from: &str) {
    let out = env.run(&[
        "campaign",
        "create",
        name,
        "--list",
        list,
        "--template",
        template,
        "--subject",
        subject,
        "--from",
        from,
        "--public-url",
        "http://127.0.0.1:9/mail",
        "--return-path",
        "bounces@bounce.example.test",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Send every campaign in `names` through one worker; the captured messages.
fn send_all(env: &Env, peer: &ScriptedSmtp, names: &[&str]) -> Vec<String> {
    for name in names {
        env.ok(&["enqueue", name]);
    }
    let _w = env.worker(&[]);
    wait_for(60, "the campaigns to finish", || {
        names.iter().all(|n| env.status(n)["pending"] == 0)
    });
    captured(peer)
}

/// The rules SpamAssassin's local tests (`spamassassin -L -t`) hit on
/// `message`: (score, name, description).
fn spamassassin(message: &str) -> Vec<(f64, String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("message.eml");
    std::fs::write(&file, message).unwrap();
    let out = Command::new("spamassassin")
        .args(["-L", "-t"])
        .stdin(std::fs::File::open(&file).unwrap())
        // Its Bayes database and autolearning stay in the temp dir.
        .env("HOME", dir.path())
        .output()
        .expect("spamassassin is missing: run scripts/install-deps.sh");
    let report = stdout(&out);
    let table = report
        .split("---- ---------------------- ")
        .nth(1)
        .unwrap_or_else(|| panic!("no rule table in\n{report}\n{}", stderr(&out)));
    let mut rules = Vec::new();
    for line in table.lines().skip(1) {
        let mut parts = line.split_whitespace();
        let (Some(score), Some(name)) = (parts.next(), parts.next()) else {
            break;
        };
        let Ok(score) = score.parse::<f64>() else {
            // A description's continuation line.
            continue;
        };
        rules.push((score, name.to_string(), parts.collect::<Vec<_>>().join(" ")));
    }
    rules
}

/// Rules that say a message is badly made even where a rule set scores
/// them 0 (their score depends on the rule set and the network tests).
const BAD_RULES: &[&str] = &[
    "FROM_EXCESS_BASE64",
    "FROM_EXCESS_QP",
    "SUBJ_EXCESS_BASE64",
    "SUBJ_EXCESS_QP",
    "MIME_BASE64_TEXT",
    "MISSING_DATE",
    "MISSING_MID",
    "MISSING_HEADERS",
    "MSGID_SHORT",
    "HEADER_FROM_DIFFERENT_DOMAINS",
];

/// Informational rules with a positive score: a DKIM signature is there
/// (offset by DKIM_VALID when SpamAssassin can look the key up in DNS,
/// which `-L` forbids).
const INFORMATIONAL: &[&str] = &["DKIM_SIGNED"];

/// Item 12: one message of each built-in template, with DKIM,
/// List-Unsubscribe and VERP, hits no SpamAssassin rule that is not
/// informational; an ASCII display name goes out as a quoted string.
#[test]
fn every_template_passes_spamassassin_local_rules() {
    let (_tmp, _bs, peer, env) = capturing(Kind::Sqlite);
    env.ok(&["dkim", "keygen", "example.test"]);
    let csv = env.dir.path().join("people.csv");
    std::fs::write(
        &csv,
        "email,name,city\nada@example.test,Ada Lovelace,London\n",
    )
    .unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    let templates = mailsplit::templates::TEMPLATES;
    for t in templates {
        create(
            &env,
            t,
            "people",
            t,
            "Our spring collection is here",
            "Linen & Co <news@example.test>",
        );
    }
    let messages = send_all(&env, &peer, templates);
    assert_eq!(messages.len(), templates.len());
    for m in &messages {
        assert_eq!(
            header(m, "From"),
            ["\"Linen & Co\" <news@example.test>"],
            "{m}"
        );
        assert!(!header(m, "DKIM-Signature").is_empty(), "{m}");
        assert!(header(m, "List-Unsubscribe")[0].starts_with("<http://127.0.0.1:9/mail/u/"));
        let bad: Vec<_> = spamassassin(m)
            .into_iter()
            .filter(|(score, name, _)| {
                (*score > 0.0 && !INFORMATIONAL.contains(&name.as_str()))
                    || BAD_RULES.contains(&name.as_str())
            })
            .collect();
        assert!(bad.is_empty(), "SpamAssassin rules hit: {bad:?}\n{m}");
    }
    let senders = peer.senders.lock().unwrap();
    assert!(
        senders["ada@example.test"].starts_with("bounces+"),
        "{senders:?}"
    );
}

/// Item 7: a 3,000-character subject, a 1,500-character From name and a
/// 2,000-character list name (one long word each, and words with
/// non-ASCII text) give no line over 998 octets, most header lines within
/// 78, the text decodes back unchanged, and DKIM still verifies.
#[test]
fn long_user_text_is_folded_within_998_and_dkim_verifies() {
    let (_tmp, _bs, peer, env) = capturing(Kind::Sqlite);
    let key = txt_record(&env.ok(&["dkim", "keygen", "example.test", "--algorithm", "ed25519"]));
    let cases = [
        ("x".repeat(3_000), "N".repeat(1_500), "L".repeat(2_000)),
        (
            "Frühlingsangebot für alle ".repeat(115),
            "Linen & Co ".repeat(136),
            "Kunden Übersicht ".repeat(118),
        ),
    ];
    let csv = env.dir.path().join("people.csv");
    std::fs::write(&csv, "email,name\nada@example.test,Ada\n").unwrap();
    let mut names = Vec::new();
    for (k, (subject, from_name, list)) in cases.iter().enumerate() {
        assert!(subject.chars().count() >= 2_990 && from_name.len() >= 1_496);
        env.ok(&["import", csv.to_str().unwrap(), "--list", list]);
        let name = format!("long{k}");
        let from = format!("{from_name} <news@example.test>");
        create(&env, &name, list, "newsletter", subject, &from);
        names.push(name);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let messages = send_all(&env, &peer, &names);
    assert_eq!(messages.len(), 2);
    for m in &messages {
        let longest = m.split("\r\n").map(str::len).max().unwrap();
        assert!(longest <= 998, "a {longest}-octet line in\n{m:.3000}");
        let head = &m[..m.find("\r\n\r\n").unwrap()];
        // Feedback-ID is one token (4 labels of at most 40): it cannot fold.
        let long: Vec<&str> = head
            .split("\r\n")
            .filter(|l| l.len() > 78 && !l.starts_with("Feedback-ID: "))
            .collect();
        assert!(long.is_empty(), "{long:?}");
        let parsed = mail_parser::MessageParser::default()
            .parse(m.as_bytes())
            .unwrap();
        let subject = parsed.subject().unwrap();
        let from = parsed.from().unwrap().first().unwrap();
        let case = cases
            .iter()
            .find(|c| c.0.trim() == subject)
            .unwrap_or_else(|| panic!("subject not decoded back: {subject:.100}"));
        assert_eq!(from.name().unwrap(), case.1.trim());
        assert_eq!(from.address().unwrap(), "news@example.test");
        let list_id = header(m, "List-Id").concat();
        assert!(list_id.ends_with(".example.test>"), "{list_id}");
        let results = dkimpy(m, std::slice::from_ref(&key));
        assert_eq!(results.len(), 1, "{head}");
        assert_eq!(
            results[0]["ok"], true,
            "dkimpy refused {}\n{head}",
            results[0]
        );
    }
}

/// Item 8: a database a newer mailsplit migrated (a migration version this
/// binary does not know) is refused by `migrate` and every other command,
/// exit 1, naming the versions; `bounce` refuses too but with 75
/// (EX_TEMPFAIL), so Postfix keeps the report until the right binary reads
/// it.
fn a_newer_database_is_refused(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    env.campaign_without_enqueue("news", 3);
    env.ok(&["migrate"]);
    env.sql(
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('20990101000000'), ('20990102000000')",
    );
    let csv = env.dir.path().join("more.csv");
    crate::util::write_csv(&csv, 2);
    let public = format!("127.0.0.1:{}", crate::util::free_port());
    let commands: Vec<Vec<&str>> = vec![
        vec!["migrate"],
        vec!["status"],
        vec!["status", "news"],
        vec!["workers"],
        vec!["campaign", "list"],
        vec!["enqueue", "news"],
        vec!["worker", "--smtp", "smtp://127.0.0.1:1"],
        vec!["serve", "--listen", &public],
        vec!["import", csv.to_str().unwrap(), "--list", "more"],
        vec!["preview", "news"],
        vec!["pause", "news"],
        vec!["rate", "list"],
        vec!["dkim", "list"],
        vec!["requeue", "news"],
    ];
    for args in &commands {
        let out = crate::util::output_within(&mut env.cmd(args), 30);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("20990101000000, 20990102000000")
                && err.contains("this binary is older than the database"),
            "{args:?}: {err}"
        );
    }
    let out =
        crate::util::output_within(env.cmd(&["bounce"]).stdin(std::process::Stdio::null()), 30);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(stderr(&out).contains("this binary is older than the database"));
    // Nothing went to beanstalkd.
    assert_eq!(bs.tube_stat(&env.tube, "total-jobs"), 0);
}

/// beanstalkd's server-wide count of a command (`cmd-release`, …).
fn server_stat(bs: &Beanstalkd, key: &str) -> u64 {
    let stats = bs.client().stats().unwrap();
    stats.get(key).and_then(|v| v.parse().ok()).unwrap()
}

/// Item 11: two databases, 2,000 recipients each, on the default tube. A
/// worker that meets the other database's jobs moves them at once to that
/// database's own tube (`mailsplit-<id>`), where the other's worker finds
/// them: every message is sent once, and beanstalkd saw no release (the
/// old code released each foreign job for 30 s).
#[test]
fn two_databases_on_the_default_tube_move_not_release() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script::default());
    let envs: Vec<Env> = (0..2)
        .map(|_| {
            let mut env = Env::new(Kind::Sqlite, &bs.addr());
            env.smtp = peer.url();
            env.tube = "mailsplit".into();
            env.campaign("news", 2_000);
            env
        })
        .collect();
    let home: Vec<String> = envs
        .iter()
        .map(|e| mailsplit::queue::home_tube(&e.identity().database_id).unwrap())
        .collect();
    assert_eq!(bs.tube_stat("mailsplit", "current-jobs-ready"), 40);

    // The first database's worker alone: it sends its own and moves the
    // other's 20 jobs to the other's tube.
    let first = envs[0].worker(&[]);
    wait_for(120, "the first campaign to finish", || {
        envs[0].status("news")["pending"] == 0
    });
    wait_for(30, "the other database's jobs to be moved", || {
        bs.tube_stat(&home[1], "current-jobs-ready") == 20
    });
    assert_eq!(bs.tube_stat("mailsplit", "current-jobs-ready"), 0);
    assert_eq!(envs[1].status("news")["sent"], 0);
    let second = envs[1].worker(&[]);
    wait_for(120, "the second campaign to finish", || {
        envs[1].status("news")["pending"] == 0
    });
    for env in &envs {
        assert_eq!(env.status("news")["sent"], 2_000);
    }
    assert_eq!(peer.total(), 4_000);
    // Both lists hold the same 2,000 addresses: each got one message from
    // each database.
    let received = peer.received.lock().unwrap().clone();
    assert_eq!(received.len(), 2_000);
    assert!(received.values().all(|&n| n == 2));
    assert_eq!(server_stat(&bs, "cmd-release"), 0, "a job was released");
    assert_eq!(bs.tube_stat(&home[1], "total-jobs"), 20);
    assert_eq!(bs.tube_stat(&home[0], "total-jobs"), 0);
    // `workers` and `status` say plainly that the tube is shared (from
    // the heartbeat; the row goes when the worker stops).
    let other = envs[1].identity().database_id;
    wait_for(30, "the heartbeat to count the moved jobs", || {
        envs[0].workers().iter().any(|w| w["foreign_jobs"] == 20)
    });
    for args in [&["workers"][..], &["status"][..]] {
        let text = envs[0].ok(args);
        assert!(
            text.contains("tube mailsplit is shared")
                && text.contains(&format!("jobs of another database ({other})"))
                && text.contains("moved 20 of them"),
            "{args:?}: {text}"
        );
    }
    assert!(!envs[1].ok(&["status"]).contains("shared"));
    let log = crate::util::stop_worker(first);
    assert!(log.contains("moving it, untouched"), "{log}");
    crate::util::stop_worker(second);
}

both!(a_newer_database_is_refused,);
