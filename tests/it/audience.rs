//! Issue 25: importing without harm (the three safety rules), `--sync`,
//! `list ls|rm|delete` and `optouts`, on SQLite and PostgreSQL.

use std::path::PathBuf;

use mailsplit::store::recipients::{self, Recipient};
use mailsplit::store::RecipientStatus;

use crate::util::*;

pub(crate) fn env(kind: Kind) -> Env {
    let env = Env::new(kind, "127.0.0.1:1");
    env.ok(&["migrate"]);
    env
}

/// Write `text` to a CSV file in the test's directory.
pub(crate) fn csv(env: &Env, name: &str, text: &str) -> PathBuf {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

pub(crate) fn import(env: &Env, path: &std::path::Path, list: &str, extra: &[&str]) -> String {
    let mut args = vec!["import", path.to_str().unwrap(), "--list", list];
    args.extend_from_slice(extra);
    env.ok(&args)
}

pub(crate) fn recipient(env: &Env, email: &str) -> Recipient {
    let mut c = env.conn();
    let id = recipients::find_by_email(&mut c, email)
        .unwrap()
        .unwrap_or_else(|| panic!("no recipient {email}"));
    recipients::load(&mut c, &[id]).unwrap().remove(0)
}

pub(crate) fn attributes(r: &Recipient) -> serde_json::Value {
    serde_json::from_str(&r.attributes).unwrap()
}

// ------------------------------------------------ rule 1: no re-subscribing

/// Recipients mailsplit recorded as unsubscribed, bounced or complained
/// stay so whatever a file says, unless `--resubscribe`.
fn import_never_resubscribes(kind: Kind) {
    let env = env(kind);
    let first = csv(
        &env,
        "first.csv",
        "email,name\na@example.test,A\nb@example.test,B\nc@example.test,C\nd@example.test,D\n",
    );
    import(&env, &first, "shop", &[]);
    env.sql(
        "UPDATE recipients SET status = 'unsubscribed', status_reason = 'one-click unsubscribe' \
         WHERE email = 'b@example.test'; \
         UPDATE recipients SET status = 'bounced', status_reason = '5.1.1' \
         WHERE email = 'c@example.test'; \
         UPDATE recipients SET status = 'unsubscribed', status_reason = 'complaint (abuse)' \
         WHERE email = 'd@example.test'",
    );
    // An export saying everyone is active, and one with no status at all.
    let active = csv(
        &env,
        "active.csv",
        "email,name,status\na@example.test,A,active\nb@example.test,B,active\n\
         c@example.test,C,\nd@example.test,D,ACTIVE\n",
    );
    let out = import(&env, &active, "shop", &[]);
    let plain = csv(&env, "plain.csv", "email\nb@example.test\nc@example.test\n");
    let out2 = import(&env, &plain, "shop", &[]);
    assert_eq!(
        recipient(&env, "b@example.test").status,
        RecipientStatus::Unsubscribed
    );
    assert_eq!(
        recipient(&env, "c@example.test").status,
        RecipientStatus::Bounced
    );
    assert_eq!(
        recipient(&env, "d@example.test").status,
        RecipientStatus::Unsubscribed
    );
    assert_eq!(
        recipient(&env, "a@example.test").status,
        RecipientStatus::Active
    );
    assert!(out.contains("kept unsubscribed: 3"), "{out}");
    assert!(out2.contains("kept unsubscribed: 2"), "{out2}");
    // An import may still unsubscribe somebody.
    let leave = csv(
        &env,
        "leave.csv",
        "email,status\na@example.test,unsubscribed\n",
    );
    import(&env, &leave, "shop", &[]);
    assert_eq!(
        recipient(&env, "a@example.test").status,
        RecipientStatus::Unsubscribed
    );
    // Only --resubscribe brings them back.
    let out = import(&env, &active, "shop", &["--resubscribe"]);
    assert!(out.contains("kept unsubscribed: 0"), "{out}");
    for e in ["a", "b", "c", "d"] {
        let r = recipient(&env, &format!("{e}@example.test"));
        assert_eq!(r.status, RecipientStatus::Active, "{e}");
    }
}

// ------------------------------------------- rule 2: only its own columns

/// A file without `name` leaves names alone; attributes merge key by key,
/// and an empty value clears that key only.
fn import_changes_only_its_columns(kind: Kind) {
    let env = env(kind);
    let full = csv(
        &env,
        "full.csv",
        "email,name,city,coupon\na@example.test,Ada,Paris,SAVE10\nb@example.test,Bob,Oslo,X\n",
    );
    import(&env, &full, "shop", &[]);
    let bare = csv(&env, "bare.csv", "email\na@example.test\n");
    import(&env, &bare, "scratch", &[]);
    let a = recipient(&env, "a@example.test");
    assert_eq!(a.name, "Ada");
    assert_eq!(
        attributes(&a),
        serde_json::json!({"city": "Paris", "coupon": "SAVE10"})
    );
    let partial = csv(
        &env,
        "partial.csv",
        "email,coupon,tier\na@example.test,,gold\n",
    );
    let out = import(&env, &partial, "shop", &[]);
    let a = recipient(&env, "a@example.test");
    assert_eq!(a.name, "Ada");
    assert_eq!(
        attributes(&a),
        serde_json::json!({"city": "Paris", "tier": "gold"})
    );
    let b = recipient(&env, "b@example.test");
    assert_eq!(
        (b.name.as_str(), attributes(&b)),
        ("Bob", serde_json::json!({"city": "Oslo", "coupon": "X"}))
    );
    assert!(out.contains("added 0 / updated 1 / unchanged 0"), "{out}");
    // The same file again changes nothing.
    let out = import(&env, &partial, "shop", &[]);
    assert!(out.contains("added 0 / updated 0 / unchanged 1"), "{out}");
}

// ------------------------------------------------- rule 3: duplicates

/// The same mailbox twice in one import: the first row wins, every later
/// one is reported with its line number and counted, and the counts add
/// up to the rows read, within a batch and across batches.
fn import_counts_duplicates(kind: Kind) {
    let env = env(kind);
    let mut text = String::from("email,name,coupon\nAda@example.test,First,A1\n");
    text.push_str("ada@EXAMPLE.test,Second,A2\nbob@example.test,Bob,B1\nnot-an-address,X,X\n");
    // Lines 6.. : enough rows to need several batches of the import.
    for i in 0..2_500 {
        text.push_str(&format!("u{i}@example.test,U{i},C{i}\n"));
    }
    // Line 2506 and 2507: a twin of line 2 and of line 6, batches later.
    text.push_str("ADA@example.test,Third,A3\nu0@example.test,Again,C\n");
    let path = csv(&env, "dups.csv", &text);
    let out = env.run(&["import", path.to_str().unwrap(), "--list", "shop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ada = recipient(&env, "ada@example.test");
    assert_eq!(ada.name, "First");
    assert_eq!(attributes(&ada)["coupon"], "A1");
    assert_eq!(recipient(&env, "u0@example.test").name, "U0");
    let err = stderr(&out);
    let prefix = format!("{}: line ", path.display());
    let mut dup_lines: Vec<u64> = err
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter(|l| l.contains("duplicate"))
        .map(|l| l.split(':').next().unwrap().parse().unwrap())
        .collect();
    dup_lines.sort();
    assert_eq!(dup_lines, [3, 2506, 2507], "{err}");
    // The report names the address and speaks of lines only.
    assert!(
        err.contains(&format!(
            "{prefix}3: duplicate: ada@example.test is the same mailbox as line 2, which is kept"
        )),
        "{err}"
    );
    let summary = stdout(&out);
    assert!(
        summary.contains(
            "added 2502 / updated 0 / unchanged 0 / skipped 1 / duplicates 3 (2506 rows read)"
        ),
        "{summary}"
    );
}

/// One import whose batches mix every kind of row: new recipients, members
/// it changes, members it leaves as they are, and recipients of another
/// list who join this one (not new recipients: their rows are reused).
/// Every row it names ends up a member, each counted once.
fn import_mixes_new_and_known_recipients(kind: Kind) {
    let env = env(kind);
    let mut shop = String::from("email,name\n");
    let mut club = String::from("email,name\n");
    for i in 0..3_000 {
        match i % 3 {
            0 => shop.push_str(&format!("s{i}@example.test,S{i}\n")),
            1 => club.push_str(&format!("c{i}@example.test,C{i}\n")),
            _ => {}
        }
    }
    import(&env, &csv(&env, "shop.csv", &shop), "shop", &[]);
    import(&env, &csv(&env, "club.csv", &club), "club", &[]);
    // Lines in source order across two batches: every third row a shop
    // member (renamed when i % 2 == 0), a club member, or nobody yet.
    let mut text = String::from("email,name\n");
    let mut wanted = Vec::new();
    for i in 0..3_000 {
        let (email, name) = match i % 3 {
            0 if i % 2 == 0 => (format!("s{i}@example.test"), format!("Renamed {i}")),
            0 => (format!("s{i}@example.test"), format!("S{i}")),
            1 => (format!("c{i}@example.test"), format!("C{i}")),
            _ => (format!("n{i}@example.test"), format!("N{i}")),
        };
        text.push_str(&format!("{email},{name}\n"));
        wanted.push(email);
    }
    let out = import(&env, &csv(&env, "mixed.csv", &text), "shop", &[]);
    // 1,000 each; of the shop members, i % 3 == 0 and even: 500 renamed.
    assert!(
        out.contains("added 2000 / updated 500 / unchanged 500 / skipped 0 / duplicates 0"),
        "{out}"
    );
    wanted.sort();
    assert_eq!(members(&env, "shop"), wanted);
    assert_eq!(members(&env, "club").len(), 1_000);
    assert_eq!(recipient(&env, "s0@example.test").name, "Renamed 0");
    assert_eq!(recipient(&env, "s3@example.test").name, "S3");
    // The club's recipients joined the shop under their existing rows.
    let shop_ids = member_ids(&env, "shop");
    assert!(member_ids(&env, "club")
        .iter()
        .all(|id| shop_ids.contains(id)));
}

// ------------------------------------------------------------ --sync

pub(crate) fn members(env: &Env, list: &str) -> Vec<String> {
    let mut c = env.conn();
    let ids = member_ids(env, list);
    let mut emails: Vec<String> = recipients::load(&mut c, &ids)
        .unwrap()
        .into_iter()
        .map(|r| r.email)
        .collect();
    emails.sort();
    emails
}

/// After `--sync` the list's members are exactly the file's rows; the
/// others leave the list and nothing else.
fn sync_removes_members_not_in_the_file(kind: Kind) {
    let env = env(kind);
    let first = csv(
        &env,
        "first.csv",
        "email,name
a@example.test,A
b@example.test,B
c@example.test,C
d@example.test,D
",
    );
    import(&env, &first, "shop", &[]);
    let other = csv(
        &env,
        "other.csv",
        "email
c@example.test
",
    );
    import(&env, &other, "other", &[]);
    env.create_campaign("spring", "shop", &[]);
    env.sql(
        "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at) \
         SELECT c.id, r.id, 'sent', 1, 1 FROM campaigns c, recipients r \
         WHERE c.name = 'spring' AND r.email = 'c@example.test'",
    );
    let sync = csv(
        &env,
        "sync.csv",
        "email,name
A@example.test,Ada
b@example.test,B
e@example.test,E
nope,X
b@example.test,B2
",
    );
    let out = import(&env, &sync, "shop", &["--sync"]);
    assert_eq!(
        members(&env, "shop"),
        ["a@example.test", "b@example.test", "e@example.test"]
    );
    assert_eq!(members(&env, "other"), ["c@example.test"]);
    assert_eq!(recipient(&env, "d@example.test").name, "D");
    assert_eq!(recipient(&env, "a@example.test").name, "Ada");
    let mut c = env.conn();
    let spring = mailsplit::store::campaigns::find(&mut c, "spring").unwrap();
    let ledger = mailsplit::store::deliveries::ledger_counts(&mut c, spring.id).unwrap();
    assert_eq!(
        ledger.get(&mailsplit::store::DeliveryState::Sent),
        Some(&1),
        "the ledger keeps c's delivery"
    );
    assert!(
        out.contains(
            "added 1 / updated 1 / unchanged 1 / removed 2 / skipped 1 / duplicates 1 (5 rows read)"
        ),
        "{out}"
    );
    // Again: nothing to do.
    let out = import(&env, &sync, "shop", &["--sync"]);
    assert!(
        out.contains("added 0 / updated 0 / unchanged 3 / removed 0 / skipped 1"),
        "{out}"
    );
}

// ------------------------------------------------------- list ls|rm|delete

/// `list ls` counts, `list rm` takes recipients off one list only, and
/// `list delete` is refused while a campaign of the list is sending.
fn lists_are_managed(kind: Kind) {
    let env = env(kind);
    let shop = csv(
        &env,
        "shop.csv",
        "email,name
a@example.test,A
b@example.test,B
c@example.test,C
",
    );
    import(&env, &shop, "shop", &[]);
    let other = csv(
        &env,
        "other.csv",
        "email
b@example.test
",
    );
    import(&env, &other, "other", &[]);
    env.sql("UPDATE recipients SET status = 'unsubscribed' WHERE email = 'c@example.test'");
    let ls = env.ok(&["list", "ls"]);
    let rows: Vec<Vec<&str>> = ls
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        // Imported lists are private and single opt-in, with no title.
        [
            vec!["other", "1", "1", "private", "single", "-"],
            vec!["shop", "3", "2", "private", "single", "-"]
        ],
        "{ls}"
    );

    let out = env.run(&[
        "list",
        "rm",
        "shop",
        "B@EXAMPLE.test",
        "nobody@example.test",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("removed 1 of 2"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("nobody@example.test is not on list"),
        "{}",
        stderr(&out)
    );
    assert_eq!(members(&env, "shop"), ["a@example.test", "c@example.test"]);
    assert_eq!(members(&env, "other"), ["b@example.test"]);
    assert_eq!(recipient(&env, "b@example.test").name, "B");
    let out = env.run(&["list", "rm", "nosuch", "a@example.test"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    env.create_campaign("spring", "shop", &[]);
    env.sql(
        "UPDATE campaigns SET state = 'queued' WHERE name = 'spring'; \
         UPDATE campaign_counters SET recipients = 2",
    );
    let out = env.run(&["list", "delete", "shop"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("campaign \"spring\" is sending"),
        "{}",
        stderr(&out)
    );
    assert_eq!(members(&env, "shop").len(), 2);
    env.sql("UPDATE campaigns SET state = 'cancelled' WHERE name = 'spring'");
    let out = env.ok(&["list", "delete", "shop"]);
    assert!(out.contains("2 members removed"), "{out}");
    assert!(members(&env, "shop").is_empty());
    let out = env.ok(&["list", "delete", "other"]);
    assert!(out.contains("list \"other\" deleted"), "{out}");
    let ls = env.ok(&["list", "ls"]);
    assert!(!ls.contains("other"), "{ls}");
    assert_eq!(
        recipient(&env, "b@example.test").status,
        RecipientStatus::Active
    );
}

// ----------------------------------------------------------------- optouts

/// Unsubscribes, bounces and complaints flow back: email, what, when,
/// campaign, as CSV or JSON lines, incrementally by `--since`.
fn optouts_lists_everyone_who_left(kind: Kind) {
    use mailsplit::store::bounces::{self, Action, BounceKind, BounceSource, NewBounce};
    let env = env(kind);
    let people = csv(
        &env,
        "people.csv",
        "email,status\na@example.test,\nb@example.test,\nc@example.test,\n\
         d@example.test,\ne@example.test,unsubscribed\n",
    );
    import(&env, &people, "shop", &[]);
    env.create_campaign("spring", "shop", &[]);
    let mut c = env.conn();
    let spring = mailsplit::store::campaigns::find(&mut c, "spring")
        .unwrap()
        .id;
    let id = |c: &mut mailsplit::store::Conn, e: &str| {
        recipients::find_by_email(c, &format!("{e}@example.test"))
            .unwrap()
            .unwrap()
    };
    let a = id(&mut c, "a");
    let reason = format!("one-click unsubscribe (campaign {spring})");
    mailsplit::store::optouts::unsubscribe(&mut c, a, &reason).unwrap();
    for (who, kind, action) in [
        (
            "b",
            BounceKind::Hard,
            Action::Bounce("5.1.1 no such user".into()),
        ),
        (
            "c",
            BounceKind::Complaint,
            Action::Unsubscribe("complaint: abuse (arf)".into()),
        ),
    ] {
        let event = NewBounce {
            recipient_id: id(&mut c, who),
            campaign_id: Some(spring),
            email: "x@example.test",
            kind,
            status: None,
            reason: "test",
            source: BounceSource::Report,
            fingerprint: who,
        };
        bounces::record(&mut c, &event, &action).unwrap();
    }
    // January for a and b, June for c and e.
    env.sql(
        "UPDATE recipients SET status_at = 1767225600000 WHERE email IN ('a@example.test', 'b@example.test'); \
         UPDATE recipients SET status_at = 1780272000000 WHERE email IN ('c@example.test', 'e@example.test')",
    );
    let all = env.ok(&["optouts"]);
    assert_eq!(
        all.lines().collect::<Vec<_>>(),
        [
            "email,what,when,campaign",
            "a@example.test,unsubscribed,2026-01-01T00:00:00Z,spring",
            "b@example.test,bounced,2026-01-01T00:00:00Z,spring",
            "c@example.test,complained,2026-06-01T00:00:00Z,spring",
            "e@example.test,unsubscribed,2026-06-01T00:00:00Z,",
        ],
        "{all}"
    );
    let recent = env.ok(&[
        "optouts",
        "--since",
        "2026-03-01T00:00:00+01:00",
        "--format",
        "json",
    ]);
    let rows: Vec<serde_json::Value> = recent
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows,
        [
            serde_json::json!({"email": "c@example.test", "what": "complained",
                "when": "2026-06-01T00:00:00Z", "campaign": "spring"}),
            serde_json::json!({"email": "e@example.test", "what": "unsubscribed",
                "when": "2026-06-01T00:00:00Z", "campaign": null}),
        ]
    );
    let bad = env.run(&["optouts", "--since", "last week"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

// ------------------------------------------------------- --from-sql sources

/// The shop's own database: a `customers` table in a SQLite file or a
/// PostgreSQL database of its own; returns the source URL.
pub(crate) fn shop_database(env: &Env, kind: Kind) -> (String, Option<TestDb>) {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let (url, db) = match kind {
        Kind::Sqlite => (
            format!("sqlite://{}", env.dir.path().join("shop.db").display()),
            None,
        ),
        Kind::Postgres => {
            let db = TestDb::empty(Kind::Postgres);
            (db.url.clone(), Some(db))
        }
    };
    let (bool_type, time_type) = match kind {
        Kind::Sqlite => ("BOOLEAN", "TEXT"),
        Kind::Postgres => ("BOOLEAN", "TIMESTAMPTZ"),
    };
    let sql = format!(
        "CREATE TABLE customers (email TEXT, name TEXT, opted_in {bool_type}, orders INTEGER, \
         last_order_at {time_type}, coupon TEXT); \
         INSERT INTO customers VALUES \
         ('ada@example.test', 'Ada Lovelace', TRUE, 3, '2026-01-02T03:04:05Z', NULL), \
         ('bob@example.test', 'Zoë Ünïcode', FALSE, 0, NULL, 'X1'), \
         ('bad-address', 'Bad', TRUE, 1, NULL, NULL)"
    );
    match kind {
        Kind::Sqlite => {
            let path = env.dir.path().join("shop.db");
            let mut c =
                diesel::sqlite::SqliteConnection::establish(path.to_str().unwrap()).unwrap();
            c.batch_execute(&sql).unwrap();
        }
        Kind::Postgres => {
            let mut c = diesel::pg::PgConnection::establish(&url).unwrap();
            c.batch_execute(&sql).unwrap();
        }
    }
    (url, db)
}

/// `import --from-sql` as the tests' server users, who can write (the
/// refusal of such users has tests of its own, which use [`from_sql_as`]).
pub(crate) fn from_sql(env: &Env, url: &str, query: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--allow-privileged-source"];
    args.extend_from_slice(extra);
    from_sql_as(env, url, query, &args)
}

/// `import --from-sql`, the source's user checked.
pub(crate) fn from_sql_as(
    env: &Env,
    url: &str,
    query: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "import",
        "--list",
        "shop",
        "--from-sql",
        query,
        "--source",
        url,
    ];
    args.extend_from_slice(extra);
    env.run(&args)
}

/// Rows from the shop's database keep their types; NULL leaves the
/// attribute out; bad rows are reported by row number; a query without
/// `email` or one that writes is refused (exit 2) and changes nothing.
fn import_from_sql(kind: Kind) {
    let env = env(kind);
    let (url, _db) = shop_database(&env, kind);
    let out = from_sql(
        &env,
        &url,
        "SELECT email, name, opted_in, orders, last_order_at, coupon FROM customers",
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out)
            .contains("added 2 / updated 0 / unchanged 0 / skipped 1 / duplicates 0 (3 rows read)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("query: row 3: invalid email"),
        "{}",
        stderr(&out)
    );
    let ada = recipient(&env, "ada@example.test");
    assert_eq!(ada.name, "Ada Lovelace");
    let attrs = attributes(&ada);
    assert_eq!(attrs["orders"], 3);
    assert!(attrs.get("coupon").is_none(), "{attrs}");
    let when = attrs["last_order_at"].as_str().unwrap();
    assert!(when.starts_with("2026-01-02T03:04:05"), "{attrs}");
    match kind {
        Kind::Postgres => assert_eq!(attrs["opted_in"], true),
        Kind::Sqlite => assert_eq!(attrs["opted_in"], 1),
    }
    let bob = recipient(&env, "bob@example.test");
    assert_eq!(bob.name, "Zoë Ünïcode");
    assert_eq!(attributes(&bob)["coupon"], "X1");

    // --sync from a narrower query.
    let out = from_sql(
        &env,
        &url,
        "SELECT email FROM customers WHERE opted_in",
        &["--sync"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("removed 1"), "{}", stdout(&out));
    assert_eq!(members(&env, "shop"), ["ada@example.test"]);
    assert_eq!(recipient(&env, "ada@example.test").name, "Ada Lovelace");

    let out = from_sql(&env, &url, "SELECT name FROM customers", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // SQL advice for a query, not a CSV header's.
    let err = stderr(&out);
    assert!(
        err.contains("no column named `email` (its columns: name)"),
        "{err}"
    );
    assert!(
        err.contains("AS email") && !err.contains("header row"),
        "{err}"
    );
    let mut writes = vec!["DELETE FROM customers"];
    if kind == Kind::Postgres {
        writes.push("WITH d AS (DELETE FROM customers RETURNING email) SELECT email FROM d");
    }
    for query in writes {
        let out = from_sql(&env, &url, query, &[]);
        assert_eq!(out.status.code(), Some(2), "{query}: {}", stderr(&out));
    }
    let again = from_sql(&env, &url, "SELECT email FROM customers", &[]);
    assert!(
        stdout(&again).contains("(3 rows read)"),
        "nothing was deleted: {}",
        stdout(&again)
    );
}

/// A source that refuses the login: exit 1, and the password is never shown.
#[test]
fn from_sql_login_failure_hides_the_password() {
    let env = env(Kind::Sqlite);
    let url = format!("{}/postgres", pg_base()).replace("://root@", "://nobody_here:S3cretPw@");
    let out = from_sql(&env, &url, "SELECT 'a@example.test' AS email", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains("S3cretPw"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot open source database"),
        "{}",
        stderr(&out)
    );
}

/// A source that fails part way (PostgreSQL raises at row 2,500, on the
/// third page the reader fetches, while the writer holds the first pages):
/// exit 1 naming the source's error, no hang, and the rows of the batch
/// written before it (2,000) kept; a rerun of a fixed query completes it.
/// Into PostgreSQL, that batch is still with the writers when the source
/// fails: they finish it before the import ends.
fn a_source_failing_part_way_stops_the_import(kind: Kind) {
    let env = env(kind);
    let db = TestDb::empty(Kind::Postgres);
    let rows = "FROM generate_series(1, 5000) n";
    let query = format!("SELECT 'u' || n || '@example.test' AS email, 1 / (n - 2500) AS x {rows}");
    let out = from_sql(&env, &db.url, &query, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("reading the source failed")
            && stderr(&out).contains("division by zero"),
        "{}",
        stderr(&out)
    );
    assert_eq!(members(&env, "shop").len(), 2000);
    let fixed = format!("SELECT 'u' || n || '@example.test' AS email {rows}");
    let out = from_sql(&env, &db.url, &fixed, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("added 3000 / updated 0 / unchanged 2000"),
        "{}",
        stdout(&out)
    );
}

/// PostgreSQL writes each batch on two connections: one failing part way
/// (a trigger refuses one mailbox of the second batch, so one writer fails
/// while the other commits its share) ends the import with exit 1 naming
/// the server's error, without a hang; the first batch is kept, and a rerun
/// once the cause is gone completes the list with nobody twice.
#[test]
fn a_writer_failing_part_way_stops_the_import() {
    let env = env(Kind::Postgres);
    env.sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.email = 'u2500@example.test' THEN RAISE EXCEPTION 'refused by a test trigger'; \
           END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse BEFORE INSERT ON recipients FOR EACH ROW EXECUTE FUNCTION refuse()",
    );
    let mut text = String::from("email\n");
    for n in 1..=5_000 {
        text.push_str(&format!("u{n}@example.test\n"));
    }
    let path = csv(&env, "five.csv", &text);
    let out = env.run(&["import", path.to_str().unwrap(), "--list", "shop"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("refused by a test trigger"),
        "{}",
        stderr(&out)
    );
    let kept = members(&env, "shop").len();
    assert!((2_000..4_000).contains(&kept), "{kept} members kept");
    env.sql("DROP TRIGGER refuse ON recipients");
    let out = env.run(&["import", path.to_str().unwrap(), "--list", "shop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "added {} / updated 0 / unchanged {kept}",
            5_000 - kept
        )),
        "{}",
        stdout(&out)
    );
    assert_eq!(members(&env, "shop").len(), 5_000);
}

/// New recipients are numbered in the order the file lists them, across
/// batches (on PostgreSQL each batch is written by two connections at
/// once, each taking its share of the mailboxes; ids numbered by whichever
/// inserts first would interleave the two shares).
fn new_recipients_are_numbered_in_file_order(kind: Kind) {
    let env = env(kind);
    // 5,000 mailboxes in an order that is not their names' (n * 7919 mod
    // 5,000 visits every n once), over three batches.
    let order: Vec<String> = (0..5_000u64)
        .map(|i| format!("r{}@example.test", i * 7_919 % 5_000))
        .collect();
    let text = format!("email\n{}\n", order.join("\n"));
    import(&env, &csv(&env, "order.csv", &text), "shop", &[]);
    let mut c = env.conn();
    let mut members = recipients::load(&mut c, &member_ids(&env, "shop")).unwrap();
    members.sort_by_key(|r| r.id);
    let by_id: Vec<String> = members.into_iter().map(|r| r.email).collect();
    assert_eq!(by_id, order);
}

/// A query's duplicate is reported by row, naming the address, never by
/// line (a query has no lines).
fn a_duplicate_in_a_query_is_reported_by_row(kind: Kind) {
    let env = env(kind);
    let (url, _db) = shop_database(&env, kind);
    let query = "SELECT email, name FROM customers WHERE email LIKE '%@%' \
                 UNION ALL SELECT upper(email), name FROM customers WHERE email = 'ada@example.test'";
    let out = from_sql(&env, &url, query, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("duplicate"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.starts_with("query: row 3: duplicate: ADA@example.test is the same mailbox as row 1,"),
        "{line}"
    );
    assert!(!line.contains("line"), "{line}");
}

both!(
    a_duplicate_in_a_query_is_reported_by_row,
    new_recipients_are_numbered_in_file_order,
    a_source_failing_part_way_stops_the_import,
    import_from_sql,
    optouts_lists_everyone_who_left,
    lists_are_managed,
    sync_removes_members_not_in_the_file,
    import_never_resubscribes,
    import_changes_only_its_columns,
    import_counts_duplicates,
    import_mixes_new_and_known_recipients,
);
