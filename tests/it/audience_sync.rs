//! Issue 25, `--sync` under stress: a source that names nobody is refused
//! rather than emptying the list, and two imports of one list at the same
//! time run one after the other instead of sweeping each other's rows.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::audience::{csv, env, import, members};
use crate::util::*;

/// `email,name` rows `{prefix}{i}@example.test` for i in `range`.
fn rows(prefix: &str, range: std::ops::Range<usize>) -> String {
    range
        .map(|i| format!("{prefix}{i}@example.test,N{i}\n"))
        .collect()
}

/// An empty source (or one whose every row is bad) with `--sync` would
/// take everybody off the list: exit 2 naming `--allow-empty`, nothing
/// removed; with `--allow-empty` the list is emptied.
fn sync_refuses_an_empty_source(kind: Kind) {
    let env = env(kind);
    let full = csv(
        &env,
        "full.csv",
        "email,name\na@example.test,A\nb@example.test,B\n",
    );
    import(&env, &full, "shop", &[]);
    let empty = csv(&env, "empty.csv", "email,name\n");
    let bad = csv(&env, "bad.csv", "email,name\nnot-an-address,X\n");
    for file in [&empty, &bad] {
        let out = env.run(&["import", file.to_str().unwrap(), "--list", "shop", "--sync"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("would take all 2 members off list \"shop\"")
                && stderr(&out).contains("--allow-empty"),
            "{}",
            stderr(&out)
        );
        assert_eq!(members(&env, "shop"), ["a@example.test", "b@example.test"]);
    }
    // Without --sync nothing is at stake.
    import(&env, &empty, "shop", &[]);
    let out = import(&env, &empty, "shop", &["--sync", "--allow-empty"]);
    assert!(out.contains("removed 2"), "{out}");
    assert!(members(&env, "shop").is_empty());
    // An empty list may be synced from an empty source.
    import(&env, &empty, "shop", &["--sync"]);
}

/// Import A (`--sync`, from a pipe the test feeds) is half done when import
/// B (`--sync`) of the same list starts: B says it waits, and runs when A
/// has finished, so the list ends as B's rows exactly. Interleaved, B's
/// sweep would take A's first rows off and A's sweep all of B's.
fn concurrent_syncs_run_one_after_the_other(kind: Kind) {
    let env = env(kind);
    let old = csv(
        &env,
        "old.csv",
        &format!("email,name\n{}", rows("old", 0..10)),
    );
    import(&env, &old, "shop", &[]);
    let fifo = env.dir.path().join("a.pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let a = env
        .cmd(&["import", fifo.to_str().unwrap(), "--list", "shop", "--sync"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    pipe.write_all(format!("email,name\n{}", rows("a", 0..2500)).as_bytes())
        .unwrap();
    pipe.flush().unwrap();
    // A's first batch (2,000 rows) is written: A is under way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while members(&env, "shop").len() < 2010 {
        assert!(Instant::now() < deadline, "import A wrote nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b_file = csv(&env, "b.csv", &format!("email,name\n{}", rows("b", 0..100)));
    let mut b = env
        .cmd(&[
            "import",
            b_file.to_str().unwrap(),
            "--list",
            "shop",
            "--sync",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut b_err = BufReader::new(b.stderr.take().unwrap());
    let mut first = String::new();
    b_err.read_line(&mut first).unwrap();
    assert!(
        first.contains("waiting for another import of list \"shop\""),
        "B did not wait for A: {first:?}"
    );
    pipe.write_all(rows("a", 2500..3000).as_bytes()).unwrap();
    drop(pipe);
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", stderr(&a));
    assert!(
        stdout(&a).contains("added 3000 / updated 0 / unchanged 0 / removed 10"),
        "{}",
        stdout(&a)
    );
    let b = b.wait_with_output().unwrap();
    assert!(b.status.success());
    assert!(
        stdout(&b).contains("added 100 / updated 0 / unchanged 0 / removed 3000"),
        "{}",
        stdout(&b)
    );
    let expected: Vec<String> = {
        let mut v: Vec<String> = (0..100).map(|i| format!("b{i}@example.test")).collect();
        v.sort();
        v
    };
    assert_eq!(members(&env, "shop"), expected);
}

both!(
    sync_refuses_an_empty_source,
    concurrent_syncs_run_one_after_the_other
);
