//! `mailsplit <command> | head -1`: every command that prints, run with
//! stdout a pipe whose reader is gone before the first write, exits 0 with
//! nothing on stderr about the pipe (no panic, no "Broken pipe"), and still
//! does its work.

use std::process::{Command, Output, Stdio};

use crate::util::*;

/// Run with stdout a pipe whose reading end is already closed.
fn closed(cmd: &mut Command) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Assert `args` exits 0 quietly with a closed stdout.
fn quiet(env: &Env, args: &[&str]) {
    let out = closed(&mut env.cmd(args));
    let err = stderr(&out);
    assert!(
        out.status.code() == Some(0),
        "mailsplit {args:?} with a closed stdout: {:?}\n{err}",
        out.status
    );
    for bad in ["panicked", "Broken pipe", "os error 32", "error:"] {
        assert!(
            !err.contains(bad),
            "mailsplit {args:?} with a closed stdout said {bad:?}:\n{err}"
        );
    }
}

#[test]
fn every_printing_command_exits_0_on_a_closed_pipe() {
    let env = World::new(Kind::Sqlite);
    quiet(&env, &["--help"]);
    quiet(&env, &["--version"]);
    quiet(&env, &["templates"]);
    quiet(&env, &["migrate"]);
    // Before anything exists: the "nothing yet" lines.
    quiet(&env, &["campaign", "list"]);
    quiet(&env, &["dkim", "list"]);
    quiet(&env, &["rate", "list"]);
    quiet(&env, &["workers"]);
    quiet(&env, &["status"]);

    let csv = env.dir.path().join("news.csv");
    write_csv(&csv, 30);
    quiet(&env, &["import", csv.to_str().unwrap(), "--list", "news"]);
    let created = closed(&mut env.cmd(&[
        "campaign",
        "create",
        "news",
        "--list",
        "news",
        "--template",
        "newsletter",
        "--subject",
        "Hello",
        "--from",
        "news@example.test",
        "--public-url",
        "https://mail.example.test",
    ]));
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(
        !stderr(&created).contains("panicked"),
        "{}",
        stderr(&created)
    );
    // The work was done although nobody read what it said.
    assert_eq!(env.status("news")["recipients"], 30);

    quiet(&env, &["rate", "set", "domain:example.test", "100/s"]);
    quiet(
        &env,
        &[
            "rate",
            "set",
            "relay:127.0.0.1:25",
            "50/s",
            "--connections",
            "3",
        ],
    );
    assert!(env.ok(&["rate", "list"]).contains("connection"));
    quiet(
        &env,
        &["dkim", "keygen", "example.test", "--algorithm", "ed25519"],
    );
    quiet(&env, &["enqueue", "news"]);
    quiet(&env, &["enqueue", "news"]);
    quiet(&env, &["requeue", "news"]);
    quiet(&env, &["requeue", "news", "--failed"]);
    quiet(&env, &["pause", "news"]);
    quiet(&env, &["resume", "news"]);

    // Now with rows to show.
    quiet(&env, &["campaign", "list"]);
    quiet(&env, &["status"]);
    quiet(&env, &["status", "--json"]);
    quiet(&env, &["status", "news"]);
    quiet(&env, &["status", "news", "--json"]);
    quiet(&env, &["rate", "list"]);
    quiet(&env, &["dkim", "list"]);
    quiet(&env, &["workers"]);
    quiet(&env, &["workers", "--json"]);
    quiet(&env, &["preview", "news"]);
    quiet(&env, &["templates", "show", "newsletter"]);
    quiet(&env, &["list", "ls"]);
    quiet(&env, &["optouts"]);
    quiet(&env, &["optouts", "--format", "json"]);

    let maildir = env.dir.path().join("Maildir");
    for sub in ["new", "cur", "tmp"] {
        std::fs::create_dir_all(maildir.join(sub)).unwrap();
    }
    quiet(&env, &["bounce", "--maildir", maildir.to_str().unwrap()]);

    quiet(&env, &["rate", "delete", "domain:example.test"]);
    quiet(&env, &["dkim", "delete", "example.test"]);
    quiet(&env, &["cancel", "news"]);
    assert_eq!(env.status("news")["state"], "cancelled");
    quiet(&env, &["list", "delete", "news"]);
}
