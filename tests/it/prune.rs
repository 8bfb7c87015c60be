//! `list prune L --inactive SPAN [--dry-run]`: the members the list's
//! tracked campaigns mailed within the period who opened and clicked
//! nothing since, counted first and taken off the list (never off file),
//! on SQLite and PostgreSQL.

use std::time::{SystemTime, UNIX_EPOCH};

use mailsplit::store::RecipientStatus;

use crate::audience::{csv, env, import, members, recipient};
use crate::util::*;

const DAY: i64 = 86_400_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A campaign of `list` whose content is an HTML file with one link.
fn campaign(env: &Env, name: &str, list: &str, track: &[&str]) -> i64 {
    let html = csv(
        env,
        "m.html",
        "<p>Hi <a href=\"https://shop.example/\">shop</a></p>",
    );
    let mut args = vec![
        "campaign",
        "create",
        name,
        "--list",
        list,
        "--html",
        html.to_str().unwrap(),
        "--subject",
        "Hi",
        "--from",
        "news@shop.example",
        "--public-url",
        "https://mail.shop.example",
    ];
    args.extend_from_slice(track);
    env.ok(&args);
    env.status(name)["id"].as_i64().unwrap()
}

/// A delivery of `campaign` to `email` in `state`, `days_ago` days ago.
fn delivered(env: &Env, campaign: i64, email: &str, state: &str, days_ago: i64) {
    let at = now_ms() - days_ago * DAY;
    env.sql(&format!(
        "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at) \
         SELECT {campaign}, id, '{state}', 1, {at} FROM recipients WHERE email = '{email}'"
    ));
}

/// `email`'s engagement with `campaign`: `column` (first_open_at,
/// first_click_at or first_machine_open_at) `days_ago` days ago.
fn engaged(env: &Env, campaign: i64, email: &str, column: &str, days_ago: i64) {
    let at = now_ms() - days_ago * DAY;
    let count = match column {
        "first_open_at" => "opens",
        "first_click_at" => "clicks",
        _ => "machine_opens",
    };
    env.sql(&format!(
        "INSERT INTO engagement (campaign_id, recipient_id, {column}, {count}) \
         SELECT {campaign}, id, {at}, 1 FROM recipients WHERE email = '{email}'"
    ));
}

/// Who is pruned: mailed by a tracked campaign of the list within the
/// period and neither opened nor clicked anything since (a mail proxy's
/// open is no reader's). Who stays: openers, clickers (also of another
/// list's campaign), members not mailed, mailed only before the period,
/// mailed only by an untracked campaign, or whose message failed.
fn prune_takes_the_mailed_who_did_nothing(kind: Kind) {
    let env = env(kind);
    let people = [
        "opener",
        "clicker",
        "silent",
        "proxied",
        "unmailed",
        "old",
        "untracked",
        "failed",
        "elsewhere",
    ];
    let rows: String = people
        .iter()
        .map(|p| format!("{p}@example.test\n"))
        .collect();
    import(
        &env,
        &csv(&env, "shop.csv", &format!("email\n{rows}")),
        "shop",
        &[],
    );
    import(
        &env,
        &csv(&env, "other.csv", "email\nelsewhere@example.test\n"),
        "other",
        &[],
    );
    let tracked = campaign(&env, "recent", "shop", &["--track", "opens,clicks"]);
    let plain = campaign(&env, "plain", "shop", &[]);
    let other = campaign(&env, "news", "other", &["--track", "opens"]);
    for p in ["opener", "clicker", "silent", "proxied", "elsewhere"] {
        delivered(&env, tracked, &format!("{p}@example.test"), "sent", 10);
    }
    delivered(&env, tracked, "old@example.test", "sent", 200);
    engaged(&env, tracked, "old@example.test", "first_open_at", 199);
    delivered(&env, plain, "untracked@example.test", "sent", 5);
    delivered(&env, tracked, "failed@example.test", "failed", 10);
    engaged(&env, tracked, "opener@example.test", "first_open_at", 9);
    engaged(&env, tracked, "clicker@example.test", "first_click_at", 9);
    engaged(
        &env,
        tracked,
        "proxied@example.test",
        "first_machine_open_at",
        10,
    );
    delivered(&env, other, "elsewhere@example.test", "sent", 3);
    engaged(&env, other, "elsewhere@example.test", "first_open_at", 2);

    let dry = env.ok(&["list", "prune", "shop", "--inactive", "180d", "--dry-run"]);
    assert!(
        dry.starts_with(
            "list \"shop\": 2 members mailed in the last 180d opened and clicked nothing\n"
        ),
        "{dry}"
    );
    assert!(
        dry.contains("  silent@example.test\n") && dry.contains("  proxied@example.test\n"),
        "{dry}"
    );
    assert!(!dry.contains("removed"), "{dry}");
    assert_eq!(members(&env, "shop").len(), people.len());

    let out = env.ok(&["list", "prune", "shop", "--inactive", "180d"]);
    assert!(out.starts_with("list \"shop\": 2 members"), "{out}");
    assert!(out.contains("removed 2 inactive members"), "{out}");
    let mut kept: Vec<String> = [
        "opener",
        "clicker",
        "unmailed",
        "old",
        "untracked",
        "failed",
        "elsewhere",
    ]
    .iter()
    .map(|p| format!("{p}@example.test"))
    .collect();
    kept.sort();
    assert_eq!(members(&env, "shop"), kept);
    // Off the list, not off file: still active, still on their other lists.
    assert_eq!(
        recipient(&env, "silent@example.test").status,
        RecipientStatus::Active
    );
    assert_eq!(members(&env, "other"), ["elsewhere@example.test"]);
    // A shorter period: who was mailed 200 days ago is out of it, but so is
    // everyone else; a longer one takes the old member too.
    let again = env.ok(&["list", "prune", "shop", "--inactive", "1d", "--dry-run"]);
    assert!(again.starts_with("list \"shop\": 0 members"), "{again}");
    let long = env.ok(&["list", "prune", "shop", "--inactive", "365d", "--dry-run"]);
    assert!(long.starts_with("list \"shop\": 0 members"), "{long}");
    env.sql(
        "DELETE FROM engagement WHERE first_open_at IS NOT NULL AND opens = 1 AND campaign_id IN \
             (SELECT id FROM campaigns WHERE name = 'recent') AND recipient_id IN \
             (SELECT id FROM recipients WHERE email = 'old@example.test')",
    );
    let long = env.ok(&["list", "prune", "shop", "--inactive", "365d", "--dry-run"]);
    assert!(long.starts_with("list \"shop\": 1 members"), "{long}");
    assert!(long.contains("  old@example.test\n"), "{long}");
}

/// A period that is none, or a list whose campaigns tracked nothing (no
/// one's activity is known), is refused with exit 2 naming the fix.
fn prune_refuses_what_it_cannot_judge(kind: Kind) {
    let env = env(kind);
    import(
        &env,
        &csv(&env, "shop.csv", "email\na@example.test\n"),
        "shop",
        &[],
    );
    let plain = campaign(&env, "plain", "shop", &[]);
    delivered(&env, plain, "a@example.test", "sent", 1);
    let out = env.run(&["list", "prune", "shop", "--inactive", "6 months"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--inactive 180d"), "{}", stderr(&out));
    let out = env.run(&["list", "prune", "shop", "--inactive", "180d"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--track opens,clicks"),
        "{}",
        stderr(&out)
    );
    assert_eq!(members(&env, "shop"), ["a@example.test"]);
}

both!(
    prune_takes_the_mailed_who_did_nothing,
    prune_refuses_what_it_cannot_judge,
);
