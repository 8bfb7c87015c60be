//! The subscribers' side (issue 38): lists with a face (`list create`,
//! `list set`, `list ls`), against the real binary on SQLite and
//! PostgreSQL.

use crate::util::*;

/// The `list ls` line of `list`, split on blanks.
fn ls_line(env: &Env, list: &str) -> Vec<String> {
    let out = env.ok(&["list", "ls"]);
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(list))
        .unwrap_or_else(|| panic!("no line for {list}:\n{out}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn lists_with_a_face(kind: Kind) {
    let env = World::new(kind);
    env.ok(&["migrate"]);
    env.ok(&[
        "list",
        "create",
        "weekly",
        "--title",
        "The weekly letter",
        "--public",
        "--double-opt-in",
    ]);
    env.ok(&["list", "create", "quiet"]);
    // An imported list keeps the defaults: private, single opt-in.
    env.import_n("imported", 3);

    assert_eq!(
        ls_line(&env, "weekly"),
        ["weekly", "0", "0", "public", "double", "The", "weekly", "letter"]
    );
    assert_eq!(
        ls_line(&env, "quiet"),
        ["quiet", "0", "0", "private", "single", "-"]
    );
    assert_eq!(
        ls_line(&env, "imported"),
        ["imported", "3", "3", "private", "single", "-"]
    );

    // A second create is refused, naming the fix; nothing changes.
    let out = env.run(&["list", "create", "weekly", "--private"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("list set"), "{}", stderr(&out));
    assert_eq!(ls_line(&env, "weekly")[3], "public");

    // `list set` changes only what it names.
    env.ok(&[
        "list",
        "set",
        "imported",
        "--public",
        "--title",
        "Shop news",
    ]);
    assert_eq!(
        ls_line(&env, "imported"),
        ["imported", "3", "3", "public", "single", "Shop", "news"]
    );
    env.ok(&["list", "set", "weekly", "--private", "--single-opt-in"]);
    assert_eq!(
        ls_line(&env, "weekly"),
        ["weekly", "0", "0", "private", "single", "The", "weekly", "letter"]
    );

    // Mistakes are usage errors that say what to do.
    let out = env.run(&["list", "set", "weekly"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--title"), "{}", stderr(&out));
    let out = env.run(&["list", "set", "nosuch", "--public"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = env.run(&["list", "create", "x", "--public", "--private"]);
    assert_eq!(out.status.code(), Some(2));
}

both!(lists_with_a_face);
