//! Messages that must not mislead: permanent failures are logged (within a
//! budget, with the relay's reply, never the address) with a summary line
//! per job; a finished campaign cannot be paused or cancelled into another
//! state; no command creates a missing SQLite database; usage errors name
//! the fix. Against the real binary, beanstalkd, smtp-sink, the scripted
//! SMTP peer, SQLite and PostgreSQL.

use std::time::{Duration, Instant};

use crate::util::*;

/// Assert the exit code; returns stderr.
fn fails(out: &std::process::Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}\nstdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    stderr(out)
}

/// The number after `key=` in a log line (tracing's field format).
fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

// ------------------------------------------------------------- item 15

#[test]
fn permanent_failures_are_logged_within_a_budget_with_a_summary_per_job() {
    let mut env = World::new(Kind::Sqlite);
    // Every address refused, with a reply that quotes an address: what a
    // misconfigured relay does.
    let peer = ScriptedSmtp::start(Script {
        reject: Some("@example.test".into()),
        reject_reply: Some("550 5.7.1 <postmaster@example.test>: relay access denied".into()),
        ..Script::default()
    });
    env.smtp = peer.url();
    env.import_n("news", 300);
    // Auto-pause off: every failure reaches the log stage.
    env.create_campaign("news", "news", &["--max-failure-rate", "off"]);
    env.ok(&["enqueue", "news"]);
    let started = Instant::now();
    let w = env.worker(&["--concurrency", "20"]);
    wait_for(60, "every recipient to fail", || {
        env.status("news")["failed"] == 300
    });
    let log = stop_worker(w);
    let elapsed = started.elapsed().as_secs() + 1;

    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed for good: permanent failure"))
        .collect();
    // The budget: a burst of 20, then one a second.
    assert!(failures.len() >= 20, "{log}");
    assert!(
        failures.len() as u64 <= 20 + elapsed,
        "{} lines in {elapsed} s",
        failures.len()
    );
    for line in &failures {
        // The reply, with the address in it masked; the recipient's id.
        assert!(
            line.contains("550 5.7.1 <***@example.test>: relay access denied"),
            "{line}"
        );
        assert!(!line.contains("postmaster@"), "address logged: {line}");
        assert!(!line.contains("user"), "recipient's address logged: {line}");
        assert!(field(line, "recipient").is_some(), "{line}");
        assert!(field(line, "campaign") == Some(1), "{line}");
    }
    // What the budget held back is counted, exactly.
    let held_back: u64 = log
        .lines()
        .filter(|l| l.contains("failed for good") || l.contains("log budget"))
        .filter_map(|l| field(l, "not_logged"))
        .sum();
    assert_eq!(failures.len() as u64 + held_back, 300, "{log}");

    // One summary line per job, adding up to the campaign.
    let jobs: Vec<&str> = log.lines().filter(|l| l.contains("job finished")).collect();
    assert_eq!(jobs.len(), 3, "{log}");
    let sum = |key| jobs.iter().filter_map(|l| field(l, key)).sum::<u64>();
    assert_eq!((sum("claimed"), sum("failed"), sum("sent")), (300, 300, 0));
    assert!(jobs.iter().all(|l| l.contains("then=deleted")), "{jobs:?}");
}

#[test]
fn giving_up_and_bounces_are_logged_with_the_last_reply() {
    let mut env = World::new(Kind::Sqlite);
    let peer = ScriptedSmtp::start(Script {
        tempfail: Some(("user2@".into(), 100)),
        reject: Some("user3@".into()),
        ..Script::default()
    });
    env.smtp = peer.url();
    env.campaign("news", 3);
    let w = env.worker(&["--max-attempts", "1"]);
    wait_done(&env, "news", 60);
    let log = stop_worker(w);
    let gave_up: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed for good: temporary failures"))
        .collect();
    assert_eq!(gave_up.len(), 1, "{log}");
    assert!(
        gave_up[0].contains("451 4.3.0 try again later"),
        "{}",
        gave_up[0]
    );
    assert_eq!(field(gave_up[0], "attempts"), Some(1), "{}", gave_up[0]);
    // A 5.1.x refusal: failed, and the address is bounced for good.
    let bounced: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the recipient is now bounced"))
        .collect();
    assert_eq!(bounced.len(), 1, "{log}");
    assert!(bounced[0].contains("550 5.1.1"), "{}", bounced[0]);
    let job = log.lines().find(|l| l.contains("job finished")).unwrap();
    assert_eq!(
        (field(job, "sent"), field(job, "failed")),
        (Some(1), Some(2)),
        "{job}"
    );
}

// ------------------------------------------------------------- item 16

fn a_done_campaign_cannot_be_paused_or_cancelled(kind: Kind) {
    let mut env = World::new(kind);
    let sink = SmtpSink::start(&[]);
    env.smtp = sink.url();
    env.campaign("news", 10);
    let w = env.worker(&[]);
    wait_for(60, "the campaign to be done", || {
        env.status("news")["state"] == "done"
    });
    drop(w);
    for cmd in ["pause", "cancel"] {
        let err = fails(&env.run(&[cmd, "news"]), 2);
        assert!(
            err.contains(&format!("cannot {cmd} campaign \"news\"")),
            "{err}"
        );
        assert!(err.contains("it is done"), "{err}");
    }
    let status = env.status("news");
    assert_eq!(status["state"], "done");
    assert_eq!(status["sent"], 10);
    // A campaign that is not finished still pauses and cancels.
    env.campaign("later", 5);
    env.ok(&["pause", "later"]);
    env.ok(&["cancel", "later"]);
    assert_eq!(env.status("later")["state"], "cancelled");
}

#[test]
fn no_command_creates_a_missing_sqlite_database() {
    let env = World::new(Kind::Sqlite);
    let csv = env.dir.path().join("people.csv");
    write_csv(&csv, 2);
    let csv = csv.to_str().unwrap();
    // A typo in the file name, relative to the working directory.
    let typo = env.dir.path().join("mailsplt.db");
    let commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["status", "news", "--json"],
        vec!["campaign", "list"],
        vec!["preview", "news"],
        vec!["rate", "list"],
        vec!["dkim", "list"],
        vec!["workers"],
        vec!["import", csv, "--list", "people"],
        vec![
            "campaign",
            "create",
            "news",
            "--list",
            "people",
            "--template",
            "newsletter",
            "--subject",
            "Hi",
            "--from",
            "news@example.test",
        ],
        vec!["enqueue", "news"],
        vec!["pause", "news"],
        vec!["rate", "set", "domain:example.test", "10/s"],
        vec!["worker"],
    ];
    for args in commands {
        let out = output_within(
            env.cmd(&args).env("DATABASE_URL", "sqlite://mailsplt.db"),
            20,
        );
        let err = fails(&out, 1);
        assert!(err.contains(&typo.display().to_string()), "{args:?}: {err}");
        assert!(err.contains("does not exist"), "{args:?}: {err}");
        assert!(err.contains("mailsplit migrate"), "{args:?}: {err}");
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
    let out = env
        .cmd(&["templates"])
        .env("DATABASE_URL", "sqlite://mailsplt.db")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!typo.exists());
    // Only migrate creates it.
    let out = env
        .cmd(&["migrate"])
        .env("DATABASE_URL", "sqlite://mailsplt.db")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(typo.exists());
}

#[test]
fn read_only_commands_read_a_database_another_process_is_writing() {
    let env = World::new(Kind::Sqlite);
    env.campaign("news", 20);
    // Another process holds SQLite's write lock: a read-only command still
    // reads (WAL), at once, and changes nothing.
    let mut writer = env.conn();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    for args in [
        &["status", "news", "--json"][..],
        &["campaign", "list"],
        &["rate", "list"],
        &["dkim", "list"],
        &["preview", "news"],
    ] {
        env.ok(args);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "read-only commands waited for the writer"
    );
    writer.execute_batch("ROLLBACK").unwrap();
}

#[test]
fn a_bad_rate_group_names_the_valid_forms() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    let err = fails(&env.run(&["rate", "set", "bogus", "10/s"]), 2);
    assert!(!err.contains("stored value"), "{err}");
    assert!(err.contains("bad rate group \"bogus\""), "{err}");
    for form in [
        "relay:HOST:PORT",
        "campaign:NAME",
        "domain:DOMAIN",
        "domain:*",
    ] {
        assert!(err.contains(form), "{err}");
    }
}

#[test]
fn an_unresolvable_beanstalkd_host_is_named_as_such() {
    let (_tmp, bs, env) = env_with_beanstalkd(Kind::Sqlite);
    env.campaign_without_enqueue("news", 3);
    for cmd in [&["enqueue", "news"][..], &["worker"], &["pause", "news"]] {
        let out = output_within(
            env.cmd(cmd).env("BEANSTALKD", "no-such-host.invalid:11300"),
            20,
        );
        let err = fails(&out, 2);
        assert!(err.contains("no-such-host.invalid"), "{cmd:?}: {err}");
        assert!(err.contains("does not resolve"), "{cmd:?}: {err}");
        assert!(!err.contains("expected HOST:PORT"), "{cmd:?}: {err}");
    }
    // A malformed address still says what form is expected.
    let err = fails(
        &env.run(&["enqueue", "news", "--beanstalkd", "127.0.0.1:notaport"]),
        2,
    );
    assert!(err.contains("expected HOST:PORT"), "{err}");
    assert_eq!(env.status("news")["state"], "draft");
    assert_eq!(bs.tube_stat(&env.tube, "total-jobs"), 0);
}

#[test]
fn campaign_names_that_would_mislead_are_refused() {
    let env = World::new(Kind::Sqlite);
    env.import_n("news", 3);
    let long = "x".repeat(101);
    for name in [
        "3",
        "0042",
        "",
        "  ",
        "two\nlines",
        "tab\there",
        long.as_str(),
    ] {
        let err = fails(&env.try_create_campaign(name, "news", &[]), 2);
        assert!(err.contains("bad campaign name"), "{name:?}: {err}");
    }
    let err = fails(&env.try_create_campaign("3", "news", &[]), 2);
    assert!(err.contains("shadow the campaign with that id"), "{err}");
    assert!(env.ok(&["campaign", "list"]).contains("no campaigns yet"));
    // At the limit, and with letters among the digits, names are fine.
    env.create_campaign(&"é".repeat(100), "news", &[]);
    env.create_campaign("2025-spring", "news", &[]);
    assert_eq!(env.ok(&["campaign", "list"]).lines().count(), 2);
}

#[test]
fn an_empty_csv_or_one_without_email_is_a_usage_error() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    for (file, text, says) in [
        ("empty.csv", "", "is empty"),
        ("blank.csv", "\n\n", "`email`"),
        (
            "noemail.csv",
            "name,city\nAda,London\n",
            "no `email` column",
        ),
    ] {
        let path = env.dir.path().join(file);
        std::fs::write(&path, text).unwrap();
        let err = fails(
            &env.run(&["import", path.to_str().unwrap(), "--list", "people"]),
            2,
        );
        assert!(err.contains(says), "{file}: {err}");
        assert!(err.contains("email,name"), "{file}: {err}");
    }
    let err = fails(&env.try_create_campaign("news", "people", &[]), 2);
    assert!(
        err.contains("unknown list"),
        "nothing imported, no list: {err}"
    );
}

both!(a_done_campaign_cannot_be_paused_or_cancelled,);
