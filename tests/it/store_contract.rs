//! The store's contract, written once and run against both backends (STYLE
//! item 9, after fang's `queue_tests.rs`): every scenario below is a plain
//! function of the backend `Kind`, and `contract!` instantiates it as a
//! `#[test]` in a `sqlite` and a `postgres` module. A store change that
//! behaves differently on one backend fails there by name.
//!
//! The scenarios follow DESIGN.md "Delivery semantics": import upserts,
//! the campaign state machine, crash-safe enqueue steps, and the ledger's
//! claim/record rules with counters that always equal a `COUNT(*)`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::util::{Kind, TestDb};
use mailsplit::store::campaigns::{self, Confirm, Control, Intent, NewCampaign};
use mailsplit::store::deliveries::{self, Outcome, OutcomeKind, Recorded};
use mailsplit::store::imports::{self, Row, Written};
use mailsplit::store::recipients::{self, RecipientStatus};
use mailsplit::store::{now_ms, CampaignState, Claim, Conn, DeliveryState, StoreError};

/// Instantiate each scenario once per backend. A scenario's attributes
/// (`#[ignore = ".."]`) apply to both instances.
macro_rules! contract {
    ($($(#[$meta:meta])* $name:ident),* $(,)?) => {
        mod sqlite {
            $(
                $(#[$meta])*
                #[test]
                fn $name() {
                    super::$name(super::Kind::Sqlite)
                }
            )*
        }
        mod postgres {
            $(
                $(#[$meta])*
                #[test]
                fn $name() {
                    super::$name(super::Kind::Postgres)
                }
            )*
        }
    };
}

contract!(
    generic_plans_only_while_the_ledger_is_large,
    migrate_applies_once,
    check_migrated_on_empty_database_names_the_fix,
    upsert_counts_inserted_then_updated,
    reimport_keeps_status_unless_asked,
    membership_is_not_duplicated,
    one_recipient_per_mailbox,
    migrate_merges_mailboxes_imported_twice,
    migrate_carries_an_old_intent_over,
    member_page_is_keyset_paginated,
    campaign_create_and_find,
    duplicate_campaign_is_a_usage_error,
    unknown_campaign_is_a_usage_error,
    control_refuses_illegal_transitions,
    flags_see_a_raw_sql_pause,
    enqueue_step_moves_cursor_and_counters,
    finish_enqueue_makes_recipient_count_exact,
    enqueue_lease_admits_one_run_at_a_time,
    a_run_whose_lease_ran_out_changes_nothing,
    fresh_claim_owns_everything,
    second_token_owns_nothing_and_sees_busy_until,
    a_job_claims_only_list_members_and_reads_them,
    a_job_reads_only_the_attributes_named,
    sent_is_final_for_every_later_claim,
    retry_reclaims_with_more_attempts_then_fails,
    a_job_of_new_and_retried_recipients_counts_each_attempt,
    unclaim_gives_the_attempt_back,
    expired_lease_is_claimable_by_another_token,
    extended_lease_is_not_claimable,
    stale_token_records_nothing,
    counters_equal_ledger_after_mixed_outcomes,
    a_batch_says_which_campaigns_it_paused,
    concurrent_claims_send_each_recipient_once,
    empty_inputs_are_no_ops,
    stale_sent_after_other_token_sent_is_lost,
    a_batch_of_successes_counts_each_campaign_and_ends_a_failure_streak,
    store_functions_compose_inside_one_transaction,
);

// ---------------------------------------------------------------- fixtures

/// A fresh database, migrated, with a connection to it. The `TestDb` must
/// outlive the connection (it drops the database).
fn migrated(kind: Kind) -> (TestDb, Conn) {
    let db = TestDb::new(kind);
    let mut conn = Conn::open(&db.url).expect("open test database");
    conn.migrate().expect("migrate");
    (db, conn)
}

fn person(email: &str, name: &str, status: &str) -> Row {
    let attributes = serde_json::json!({"city": "Paris"});
    Row {
        line: 0,
        email: email.to_string(),
        email_key: mailsplit::mailbox::key(email).unwrap(),
        name: Some(name.to_string()),
        attributes: attributes.as_object().unwrap().clone(),
        status: Some(status.parse().unwrap()),
        new_id: None,
    }
}

/// `n` active recipients `{prefix}{i}@example.test`.
fn people(prefix: &str, n: usize) -> Vec<Row> {
    (1..=n)
        .map(|i| {
            person(
                &format!("{prefix}{i}@example.test"),
                &format!("User {i}"),
                "active",
            )
        })
        .collect()
}

/// Import rows into a list as `import` does (one run, one batch in one
/// transaction). Without `with_status` the rows carry no status (a file
/// without a status column); with it the file's status wins, as
/// `--resubscribe` allows.
fn import(conn: &mut Conn, list: &str, rows: &[Row], with_status: bool) -> (i64, Written) {
    let run = imports::begin(conn, list).unwrap();
    let rows: Vec<Row> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| Row {
            line: i as u64 + 1,
            status: if with_status { r.status } else { None },
            ..r.clone()
        })
        .collect();
    let written = conn
        .transaction(|c| imports::write_batch(c, run, &rows, with_status))
        .unwrap();
    (run.list_id, written)
}

/// What a batch did, as (added to the list, updated, unchanged).
fn counts(w: &Written) -> (u64, u64, u64) {
    (w.added, w.updated, w.unchanged)
}

/// Every member id of a list, in id order.
fn member_ids(conn: &mut Conn, list_id: i64) -> Vec<i64> {
    recipients::member_page(conn, list_id, 0, i64::MAX)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

fn new_campaign(conn: &mut Conn, name: &str, list_id: i64) -> campaigns::Campaign {
    let size = recipients::list_size(conn, list_id).unwrap();
    campaigns::create(
        conn,
        &NewCampaign {
            name,
            list_id,
            template: "newsletter",
            subject: "Hello",
            from_addr: "news@example.test",
            priority: 5,
            recipients: size,
            public_url: None,
            return_path: None,
            max_failure_rate: None,
            max_complaint_rate: None,
            send_at: None,
        },
    )
    .unwrap()
}

/// A migrated database with `n` recipients on list "main" and a draft
/// campaign "news" over it.
struct Fixture {
    _db: TestDb,
    conn: Conn,
    campaign: i64,
    ids: Vec<i64>,
    url: String,
}

fn fixture(kind: Kind, n: usize) -> Fixture {
    let (db, mut conn) = migrated(kind);
    let (list_id, _) = import(&mut conn, "main", &people("user", n), false);
    let ids = member_ids(&mut conn, list_id);
    assert_eq!(ids.len(), n);
    let campaign = new_campaign(&mut conn, "news", list_id).id;
    Fixture {
        url: db.url.clone(),
        _db: db,
        conn,
        campaign,
        ids,
    }
}

/// The name the enqueue tests hold a campaign's lease under.
const RUN: &str = "pid 1 on test, run 1";

/// Take the campaign's enqueue lease as [`RUN`] (what `enqueue` does first).
fn lease(conn: &mut Conn, campaign: i64) {
    assert_eq!(
        campaigns::take_enqueue_lease(conn, campaign, RUN).unwrap(),
        None
    );
}

fn outcome(f: &Fixture, rid: i64, token: i64, kind: OutcomeKind) -> Outcome {
    Outcome {
        campaign_id: f.campaign,
        recipient_id: rid,
        token,
        kind,
        content_version: None,
    }
}

fn owned_ids(claim: &Claim) -> Vec<i64> {
    claim.owned.iter().map(|&(rid, _)| rid).collect()
}

/// (sent, failed, skipped) from the O(1) counters.
fn counted(conn: &mut Conn, campaign: i64) -> (i64, i64, i64) {
    let c = campaigns::counters(conn, campaign).unwrap();
    (c.sent, c.failed, c.skipped)
}

/// (sent, failed, skipped) from `COUNT(*)` over the ledger.
fn ledgered(conn: &mut Conn, campaign: i64) -> (i64, i64, i64) {
    let l = deliveries::ledger_counts(conn, campaign).unwrap();
    let get = |k: DeliveryState| l.get(&k).copied().unwrap_or(0);
    (
        get(DeliveryState::Sent),
        get(DeliveryState::Failed),
        get(DeliveryState::Skipped),
    )
}

fn assert_counters_match_ledger(conn: &mut Conn, campaign: i64) {
    assert_eq!(
        counted(conn, campaign),
        ledgered(conn, campaign),
        "counters (sent, failed, skipped) differ from the ledger: {:?}",
        deliveries::ledger_counts(conn, campaign).unwrap()
    );
}

/// Sleep long enough for `now_ms()` to move past a lease that just ended.
fn let_lease_lapse() {
    std::thread::sleep(Duration::from_millis(5));
}

const LEASE: i64 = 60_000;

// ---------------------------------------------------------------- schema

fn migrate_applies_once(kind: Kind) {
    let db = TestDb::empty(kind);
    let mut conn = Conn::open(&db.url).unwrap();
    let first = conn.migrate().unwrap();
    assert!(
        !first.is_empty(),
        "a fresh database has migrations to apply"
    );
    let second = conn.migrate().unwrap();
    assert!(second.is_empty(), "second migrate applied {second:?}");
    // And from a second connection too.
    let third = Conn::open(&db.url).unwrap().migrate().unwrap();
    assert!(
        third.is_empty(),
        "migrate on a new connection applied {third:?}"
    );
    conn.check_migrated().unwrap();
}

fn check_migrated_on_empty_database_names_the_fix(kind: Kind) {
    let db = TestDb::empty(kind);
    let mut conn = Conn::open(&db.url).unwrap();
    match conn.check_migrated() {
        Err(StoreError::NotMigrated(why)) => assert_eq!(why, "missing"),
        other => panic!("expected NotMigrated, got {other:?}"),
    }
    let msg = conn.check_migrated().unwrap_err().to_string();
    assert!(msg.contains("mailsplit migrate"), "{msg}");
    conn.migrate().unwrap();
    conn.check_migrated().unwrap();
}

// ---------------------------------------------------------------- recipients

fn upsert_counts_inserted_then_updated(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let rows = people("a", 30);
    let (list_id, first) = import(&mut conn, "main", &rows, false);
    assert_eq!(counts(&first), (30, 0, 0));
    let (same_list, second) = import(&mut conn, "main", &rows, false);
    assert_eq!(
        same_list, list_id,
        "get_or_create_list returns the existing list"
    );
    assert_eq!(counts(&second), (0, 0, 30), "the same rows change nothing");

    // A batch mixing known and new addresses counts each kind.
    let mut mixed = people("a", 10);
    mixed.extend(people("b", 5));
    mixed[0].name = Some("Changed".into());
    let (_, third) = import(&mut conn, "main", &mixed, false);
    assert_eq!(counts(&third), (5, 1, 9));
    assert_eq!(recipients::list_size(&mut conn, list_id).unwrap(), 35);

    // An empty batch is a no-op.
    let (_, empty) = import(&mut conn, "main", &[], false);
    assert_eq!(empty, Written::default());

    // Updated fields land.
    let mut renamed = people("a", 1);
    renamed[0].name = Some("Renamed".into());
    import(&mut conn, "main", &renamed, false);
    let ids = member_ids(&mut conn, list_id);
    let loaded = recipients::load(&mut conn, &ids).unwrap();
    let r = loaded
        .iter()
        .find(|r| r.email == "a1@example.test")
        .unwrap();
    assert_eq!(r.name, "Renamed");
    assert_eq!(r.attributes, r#"{"city":"Paris"}"#);
}

fn status_of(conn: &mut Conn, list_id: i64, email: &str) -> &'static str {
    let ids = member_ids(conn, list_id);
    let loaded = recipients::load(conn, &ids).unwrap();
    loaded
        .into_iter()
        .find(|r| r.email == email)
        .unwrap_or_else(|| panic!("{email} not on the list"))
        .status
        .as_str()
}

fn reimport_keeps_status_unless_asked(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let rows = vec![
        person("gone@example.test", "Gone", "unsubscribed"),
        person("here@example.test", "Here", "active"),
    ];
    let (list_id, _) = import(&mut conn, "main", &rows, true);
    assert_eq!(
        status_of(&mut conn, list_id, "gone@example.test"),
        "unsubscribed"
    );

    // A file without a status column: everybody reads as active, but an
    // existing recipient keeps the status it has.
    let again = vec![
        person("gone@example.test", "Gone", "active"),
        person("here@example.test", "Here", "active"),
    ];
    let (_, written) = import(&mut conn, "main", &again, false);
    assert_eq!(written.added, 0);
    assert_eq!(written.kept_unsubscribed, 1, "{written:?}");
    assert_eq!(
        status_of(&mut conn, list_id, "gone@example.test"),
        "unsubscribed"
    );
    assert_eq!(status_of(&mut conn, list_id, "here@example.test"), "active");
    let ids = member_ids(&mut conn, list_id);
    let loaded = recipients::load(&mut conn, &ids).unwrap();
    let gone = loaded
        .iter()
        .find(|r| r.email == "gone@example.test")
        .unwrap();
    assert_eq!(gone.status, recipients::RecipientStatus::Unsubscribed);

    // With a status column the file wins.
    import(&mut conn, "main", &again, true);
    assert_eq!(status_of(&mut conn, list_id, "gone@example.test"), "active");
    let bounced = vec![person("here@example.test", "Here", "bounced")];
    import(&mut conn, "main", &bounced, true);
    assert_eq!(
        status_of(&mut conn, list_id, "here@example.test"),
        "bounced"
    );
}

fn membership_is_not_duplicated(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let rows = people("m", 12);
    let (main, _) = import(&mut conn, "main", &rows, false);
    import(&mut conn, "main", &rows, false);
    import(&mut conn, "main", &rows[..4], false);
    assert_eq!(recipients::list_size(&mut conn, main).unwrap(), 12);

    // The same people on a second list: two memberships, one recipient each.
    let (other, written) = import(&mut conn, "other", &rows[..5], false);
    assert_ne!(other, main);
    assert_eq!(counts(&written), (5, 0, 0), "new to this list");
    assert_eq!(recipients::list_size(&mut conn, other).unwrap(), 5);
    assert_eq!(recipients::list_size(&mut conn, main).unwrap(), 12);
    let main_ids = member_ids(&mut conn, main);
    let other_ids = member_ids(&mut conn, other);
    assert!(other_ids.iter().all(|id| main_ids.contains(id)));

    assert_eq!(recipients::find_list(&mut conn, "other").unwrap(), other);
    match recipients::find_list(&mut conn, "nope") {
        Err(e @ StoreError::UnknownList { .. }) => {
            assert!(e.is_usage());
            let msg = e.to_string();
            assert!(msg.contains("main") && msg.contains("other"), "{msg}");
        }
        other => panic!("expected UnknownList, got {other:?}"),
    }
}

fn member_page_is_keyset_paginated(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let mut rows = people("p", 25);
    rows[7].status = Some(RecipientStatus::Unsubscribed);
    let (list_id, _) = import(&mut conn, "main", &rows, true);
    // Somebody on another list only must not show up.
    import(&mut conn, "elsewhere", &people("x", 3), false);

    let mut after = 0;
    let mut pages = Vec::new();
    loop {
        let page = recipients::member_page(&mut conn, list_id, after, 10).unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        after = page.last().unwrap().0;
        pages.push(page);
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![10, 10, 5]
    );
    let all: Vec<i64> = pages.iter().flatten().map(|(id, _)| *id).collect();
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "ids not strictly increasing: {all:?}"
    );
    let unique: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), 25, "pages overlap");
    assert_eq!(all, member_ids(&mut conn, list_id));

    let statuses: Vec<&str> = pages.iter().flatten().map(|(_, s)| s.as_str()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == "unsubscribed").count(), 1);

    // Starting after the last id gives nothing; load returns the rows asked.
    assert!(recipients::member_page(&mut conn, list_id, after, 10)
        .unwrap()
        .is_empty());
    let loaded = recipients::load(&mut conn, &all[..3]).unwrap();
    assert_eq!(
        loaded.iter().map(|r| r.id).collect::<BTreeSet<_>>(),
        all[..3].iter().copied().collect()
    );
}

// ---------------------------------------------------------------- campaigns

fn campaign_create_and_find(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let (list_id, _) = import(&mut conn, "main", &people("c", 7), false);
    let made = new_campaign(&mut conn, "spring", list_id);
    assert_eq!(made.name, "spring");
    assert_eq!(made.list_id, list_id);
    assert_eq!(made.state, CampaignState::Draft);
    assert!(!made.paused);
    assert_eq!(made.enqueue_cursor, 0);
    assert_eq!(made.pending_upto, None);

    let by_name = campaigns::find(&mut conn, "spring").unwrap();
    assert_eq!(by_name.id, made.id);
    let by_id = campaigns::find(&mut conn, &made.id.to_string()).unwrap();
    assert_eq!(by_id.name, "spring");
    assert_eq!(
        campaigns::get(&mut conn, made.id).unwrap().unwrap().name,
        "spring"
    );
    assert!(campaigns::get(&mut conn, made.id + 1000).unwrap().is_none());

    let counters = campaigns::counters(&mut conn, made.id).unwrap();
    assert_eq!(counters.recipients, 7);
    assert_eq!(
        (counters.sent, counters.failed, counters.skipped),
        (0, 0, 0)
    );
    assert_eq!(counters.pending(), 7);

    let second = new_campaign(&mut conn, "summer", list_id);
    let all = campaigns::list(&mut conn).unwrap();
    let names: Vec<&str> = all.iter().map(|(c, _)| c.name.as_str()).collect();
    assert_eq!(names, vec!["spring", "summer"], "oldest first");
    assert_eq!(all[1].1.campaign_id, second.id);
}

fn duplicate_campaign_is_a_usage_error(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let (list_id, _) = import(&mut conn, "main", &people("d", 2), false);
    new_campaign(&mut conn, "dup", list_id);
    let err = campaigns::create(
        &mut conn,
        &NewCampaign {
            name: "dup",
            list_id,
            template: "other",
            subject: "Again",
            from_addr: "x@example.test",
            priority: 1,
            recipients: 2,
            public_url: None,
            return_path: None,
            max_failure_rate: None,
            max_complaint_rate: None,
            send_at: None,
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, StoreError::CampaignExists(n) if n == "dup"),
        "{err:?}"
    );
    assert!(err.is_usage());
    // The failed create left nothing behind, and the connection still works.
    assert_eq!(campaigns::list(&mut conn).unwrap().len(), 1);
    assert_eq!(
        campaigns::find(&mut conn, "dup").unwrap().template,
        "newsletter"
    );
}

fn unknown_campaign_is_a_usage_error(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    for name in ["nope", "4242"] {
        let err = campaigns::find(&mut conn, name).unwrap_err();
        assert!(
            matches!(&err, StoreError::UnknownCampaign(n) if n == name),
            "{err:?}"
        );
        assert!(err.is_usage());
        let err = campaigns::control(&mut conn, name, Control::Pause).unwrap_err();
        assert!(matches!(err, StoreError::UnknownCampaign(_)), "{err:?}");
    }
}

fn assert_illegal(result: Result<campaigns::Campaign, StoreError>, action: &str) {
    match result {
        Err(e @ StoreError::IllegalTransition { .. }) => {
            assert!(e.is_usage());
            assert!(e.to_string().contains(action), "{e}");
        }
        other => panic!("expected IllegalTransition for {action}, got {other:?}"),
    }
}

fn control_refuses_illegal_transitions(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let (list_id, _) = import(&mut conn, "main", &people("k", 2), false);
    let id = new_campaign(&mut conn, "ctl", list_id).id;

    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Resume),
        "resume",
    );
    // A draft has nothing to pause; an enqueuing campaign has.
    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Pause),
        "pause",
    );
    campaigns::start_enqueue(&mut conn, id, 2).unwrap();
    let paused = campaigns::control(&mut conn, "ctl", Control::Pause).unwrap();
    assert!(paused.paused);
    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Pause),
        "pause",
    );
    // Control by id-as-string too.
    let resumed = campaigns::control(&mut conn, &id.to_string(), Control::Resume).unwrap();
    assert!(!resumed.paused);
    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Resume),
        "resume",
    );

    campaigns::control(&mut conn, "ctl", Control::Pause).unwrap();
    let cancelled = campaigns::control(&mut conn, "ctl", Control::Cancel).unwrap();
    assert_eq!(cancelled.state, CampaignState::Cancelled);
    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Cancel),
        "cancel",
    );
    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Pause),
        "pause",
    );
    assert_illegal(
        campaigns::control(&mut conn, "ctl", Control::Resume),
        "resume",
    );
    let end = campaigns::find(&mut conn, "ctl").unwrap();
    assert_eq!(end.state, CampaignState::Cancelled);
}

fn flags_see_a_raw_sql_pause(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let (list_id, _) = import(&mut conn, "main", &people("f", 2), false);
    let x = new_campaign(&mut conn, "x", list_id).id;
    let y = new_campaign(&mut conn, "y", list_id).id;
    let flags = campaigns::flags(&mut conn, &[x, y, y + 100]).unwrap();
    let flags: BTreeMap<i64, campaigns::Flags> = flags.into_iter().collect();
    assert_eq!(flags.len(), 2, "unknown ids are absent");
    assert!(!flags[&x].paused && !flags[&y].paused);
    assert_eq!(flags[&x].state, CampaignState::Draft);

    conn.execute_batch("UPDATE campaigns SET paused = TRUE WHERE name = 'x'")
        .unwrap();
    let flags: BTreeMap<i64, campaigns::Flags> = campaigns::flags(&mut conn, &[x, y])
        .unwrap()
        .into_iter()
        .collect();
    assert!(flags[&x].paused);
    assert!(!flags[&y].paused);
    // The state machine sees the hand-made pause as well.
    campaigns::control(&mut conn, "x", Control::Resume).unwrap();
    let flags = campaigns::flags(&mut conn, &[x]).unwrap();
    assert!(!flags[0].1.paused);
}

/// `Ada@Example.com` and `ada@example.com`, `user@bücher.de` and
/// `user@xn--bcher-kva.de`: one recipient each, keeping the first spelling.
fn one_recipient_per_mailbox(kind: Kind) {
    let (_db, mut conn) = migrated(kind);
    let first = [
        person("Ada@Example.com", "Ada", "active"),
        person("user@bücher.de", "Jo", "active"),
    ];
    let (a, written) = import(&mut conn, "a", &first, false);
    assert_eq!(counts(&written), (2, 0, 0));
    let again = [
        person("ada@example.com", "Ada L.", "unsubscribed"),
        person("USER@xn--bcher-kva.DE", "Jo B.", "active"),
    ];
    let (b, written) = import(&mut conn, "b", &again, true);
    assert_eq!(written.added, 2, "new to list b: {written:?}");
    let ids = member_ids(&mut conn, a);
    assert_eq!(member_ids(&mut conn, b), ids, "one recipient on both lists");
    let mut people = recipients::load(&mut conn, &ids).unwrap();
    people.sort_by_key(|r| r.id);
    let got: Vec<(&str, &str, RecipientStatus)> = people
        .iter()
        .map(|r| (r.email.as_str(), r.name.as_str(), r.status))
        .collect();
    assert_eq!(
        got,
        [
            ("Ada@Example.com", "Ada L.", RecipientStatus::Unsubscribed),
            ("user@bücher.de", "Jo B.", RecipientStatus::Active),
        ]
    );
    for spelling in ["ADA@example.COM", "ada@Example.com"] {
        assert_eq!(
            recipients::find_by_email(&mut conn, spelling).unwrap(),
            Some(ids[0])
        );
    }
    assert_eq!(
        recipients::find_by_email(&mut conn, "user@xn--bcher-kva.de").unwrap(),
        Some(ids[1])
    );
    // A bounce report names the address as it went out (domain as an
    // A-label), or lower-cased by an MTA: still the same recipient.
    for (spelling, id) in [
        ("<USER@XN--BCHER-KVA.DE>", ids[1]),
        ("ada@example.com", ids[0]),
    ] {
        let found = mailsplit::store::bounces::find_recipient(&mut conn, spelling).unwrap();
        assert_eq!(found.map(|(rid, _)| rid), Some(id), "{spelling}");
    }
}

/// A database at migration 3 (as `migrate` of the previous release left
/// it): the SQL of migrations 1 to 3 and diesel's record of them.
fn database_at_migration_3(kind: Kind) -> (TestDb, Conn) {
    database_before_migration(kind, "00000000000004")
}

/// A database with every migration before `version` applied, as an older
/// release's `migrate` left it.
fn database_before_migration(kind: Kind, version: &str) -> (TestDb, Conn) {
    let db = TestDb::empty(kind);
    let mut conn = Conn::open(&db.url).unwrap();
    let flavour = match kind {
        Kind::Sqlite => "sqlite",
        Kind::Postgres => "postgres",
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(flavour);
    let mut versions: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.as_str() < version)
        .collect();
    versions.sort();
    conn.execute_batch(
        "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY NOT NULL, \
         run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
    )
    .unwrap();
    for name in versions {
        let sql = std::fs::read_to_string(dir.join(&name).join("up.sql")).unwrap();
        conn.execute_batch(&sql).unwrap();
        let version = name.split('_').next().unwrap();
        conn.execute_batch(&format!(
            "INSERT INTO __diesel_schema_migrations (version) VALUES ('{version}')"
        ))
        .unwrap();
    }
    (db, conn)
}

/// An enqueue run of an older release, killed with its one-job intent
/// recorded: migration 11 carries the intent over as a window of that one
/// server, so the next run still searches for the job instead of putting it
/// again; and a hand-edited intent is refused, not read as "nothing in
/// doubt".
fn migrate_carries_an_old_intent_over(kind: Kind) {
    let (_db, mut conn) = database_before_migration(kind, "00000000000011");
    let now = now_ms();
    conn.execute_batch(&format!(
        "INSERT INTO lists (id, name, created_at) VALUES (1, 'one', {now});
         INSERT INTO campaigns (id, name, list_id, template, subject, from_addr, priority,            state, enqueue_cursor, pending_upto, pending_server, pending_after_job, created_at, updated_at) VALUES
           (1, 'killed', 1, 'newsletter', 's', 'a@example.test', 1000, 'enqueuing', 300, 400,             '127.0.0.1:11300', 17, {now}, {now}),
           (2, 'clean', 1, 'newsletter', 's', 'a@example.test', 1000, 'enqueuing', 300, NULL,             NULL, NULL, {now}, {now});"
    ))
    .unwrap();
    conn.migrate().unwrap();
    conn.check_migrated().unwrap();
    let killed = campaigns::get(&mut conn, 1).unwrap().unwrap();
    assert_eq!(
        killed.pending_intent().unwrap(),
        Some(Intent {
            upto: 400,
            servers: vec![("127.0.0.1:11300".into(), 17)],
        })
    );
    let clean = campaigns::get(&mut conn, 2).unwrap().unwrap();
    assert_eq!(clean.pending_intent().unwrap(), None);

    conn.execute_batch("UPDATE campaigns SET pending_servers = '127.0.0.1:11300' WHERE id = 1")
        .unwrap();
    let edited = campaigns::get(&mut conn, 1).unwrap().unwrap();
    let err = edited.pending_intent().unwrap_err().to_string();
    assert!(err.contains("127.0.0.1:11300"), "{err}");
}

/// Recipients imported before mailbox keys existed, some twice under two
/// spellings: after `migrate` each mailbox is mailed once, an unsubscribe
/// under either spelling holds, and re-importing any spelling works.
fn migrate_merges_mailboxes_imported_twice(kind: Kind) {
    let (_db, mut conn) = database_at_migration_3(kind);
    let now = now_ms();
    conn.execute_batch(&format!(
        "INSERT INTO lists (id, name, created_at) VALUES (1, 'one', {now}), (2, 'two', {now});
         INSERT INTO recipients (id, email, name, status, status_reason, updated_at) VALUES
           (1, 'Ada@example.com', 'Ada', 'active', NULL, {now}),
           (2, 'ada@example.com', 'ada', 'unsubscribed', 'one-click unsubscribe', {now}),
           (3, 'ADA@EXAMPLE.COM', 'ADA', 'active', NULL, {now}),
           (4, 'user@bücher.de', 'Jo', 'active', NULL, {now}),
           (5, 'User@xn--bcher-kva.de', 'Jo', 'active', NULL, {now}),
           (6, 'bob@example.com', 'Bob', 'active', NULL, {now}),
           (7, 'zoë@bücher.de', 'Zoë', 'active', NULL, {now});
         INSERT INTO list_members (list_id, recipient_id) VALUES
           (1, 1), (2, 2), (2, 3), (1, 4), (2, 5), (1, 6), (2, 7);"
    ))
    .unwrap();
    if kind == Kind::Postgres {
        // Rows inserted with explicit ids: move the sequences past them.
        conn.execute_batch(
            "SELECT setval('recipients_id_seq', 100); SELECT setval('lists_id_seq', 100)",
        )
        .unwrap();
    }
    conn.migrate().unwrap();
    conn.check_migrated().unwrap();

    let row = |conn: &mut Conn, id: i64| {
        let r = recipients::load(conn, &[id]).unwrap().pop().unwrap();
        (r.email, r.status)
    };
    let key = |conn: &mut Conn, email: &str| recipients::find_by_email(conn, email).unwrap();
    // Ada: the oldest row holds the mailbox and inherits the unsubscribe.
    assert_eq!(key(&mut conn, "ada@EXAMPLE.com"), Some(1));
    assert_eq!(
        row(&mut conn, 1),
        ("Ada@example.com".into(), RecipientStatus::Unsubscribed)
    );
    assert_eq!(row(&mut conn, 2).1, RecipientStatus::Unsubscribed);
    assert_eq!(row(&mut conn, 3).1, RecipientStatus::Unsubscribed);
    // bücher.de: keyed by IDNA; the row keyed first holds it.
    assert_eq!(key(&mut conn, "user@bücher.de"), Some(5));
    assert_eq!(row(&mut conn, 5).1, RecipientStatus::Active);
    assert_eq!(row(&mut conn, 4).1, RecipientStatus::Unsubscribed);
    // The holders joined their twins' lists; every list mails each
    // mailbox at most once.
    assert_eq!(member_ids(&mut conn, 1), [1, 4, 5, 6]);
    assert_eq!(member_ids(&mut conn, 2), [1, 2, 3, 5, 7]);
    for list in [1, 2] {
        let ids = member_ids(&mut conn, list);
        let active: Vec<String> = recipients::load(&mut conn, &ids)
            .unwrap()
            .into_iter()
            .filter(|r| r.status == RecipientStatus::Active)
            .map(|r| mailsplit::mailbox::key(&r.email).unwrap())
            .collect();
        let distinct: BTreeSet<&String> = active.iter().collect();
        assert_eq!(distinct.len(), active.len(), "list {list}: {active:?}");
    }
    assert_eq!(key(&mut conn, "ZOË@bücher.de"), Some(7));
    assert_eq!(key(&mut conn, "bob@example.com"), Some(6));

    // Importing any spelling again updates the holder, never a twin.
    let (_, written) = import(
        &mut conn,
        "one",
        &[
            person("ADA@example.com", "Ada Lovelace", "active"),
            person("user@XN--BCHER-KVA.de", "Jo", "active"),
        ],
        false,
    );
    assert_eq!(
        counts(&written),
        (0, 2, 0),
        "the holders updated, no twin added"
    );
    let (three, written) = import(
        &mut conn,
        "three",
        &[person("new@bücher.de", "New", "active")],
        false,
    );
    assert_eq!(counts(&written), (1, 0, 0));
    let new = member_ids(&mut conn, three);
    assert_eq!(new.len(), 1);
    assert_eq!(key(&mut conn, "NEW@xn--bcher-kva.de"), Some(new[0]));
    // Idempotent.
    conn.migrate().unwrap();
    assert_eq!(key(&mut conn, "ada@example.com"), Some(1));
    assert_eq!(member_ids(&mut conn, 1), [1, 4, 5, 6]);
}

// ---------------------------------------------------------------- enqueue

fn enqueue_step_moves_cursor_and_counters(kind: Kind) {
    let mut f = fixture(kind, 10);
    let (c, ids) = (f.campaign, f.ids.clone());
    lease(&mut f.conn, c);
    campaigns::start_enqueue(&mut f.conn, c, 10).unwrap();
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(camp.state, CampaignState::Enqueuing);

    // Intent for the first job (ids[0..4]) is recorded before the put.
    let intent = Intent {
        upto: ids[3],
        servers: vec![("127.0.0.1:11300".into(), 17), ("[::1]:11301".into(), 4)],
    };
    campaigns::enqueue_step(&mut f.conn, c, RUN, None, Some(&intent)).unwrap();
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(
        camp.enqueue_cursor, 0,
        "an intent alone does not move the cursor"
    );
    assert_eq!(camp.pending_upto, Some(ids[3]));
    assert_eq!(camp.pending_intent().unwrap(), Some(intent));
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!((counters.enqueued, counters.jobs), (0, 0));

    // Confirm it (4 enqueued, ids[4] skipped) and record the next intent.
    let next = Intent {
        upto: ids[8],
        servers: vec![("127.0.0.1:11301".into(), 18)],
    };
    let confirm = Confirm {
        cursor: ids[4],
        enqueued: 4,
        jobs: 1,
        skipped: vec![ids[4]],
    };
    campaigns::enqueue_step(&mut f.conn, c, RUN, Some(&confirm), Some(&next)).unwrap();
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(camp.enqueue_cursor, ids[4]);
    assert_eq!(camp.pending_intent().unwrap(), Some(next));
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(
        (
            counters.enqueued,
            counters.jobs,
            counters.skipped,
            counters.enqueue_skipped
        ),
        (4, 1, 1, 1)
    );
    assert_eq!(ledgered(&mut f.conn, c), (0, 0, 1));
    assert_eq!(
        deliveries::recipients_in_range(&mut f.conn, c, ids[3], ids[4]).unwrap(),
        [ids[4]]
    );
    assert_eq!(
        deliveries::recipients_in_range(&mut f.conn, c, 0, ids[9]).unwrap(),
        [ids[4]]
    );
    assert!(
        deliveries::recipients_in_range(&mut f.conn, c, ids[4], ids[9])
            .unwrap()
            .is_empty()
    );

    // Confirm the last job and clear the intent; skipping ids[4] again
    // (a re-run after a crash) writes no second row and counts nothing.
    let last = Confirm {
        cursor: ids[9],
        enqueued: 4,
        jobs: 1,
        skipped: vec![ids[4], ids[9]],
    };
    campaigns::enqueue_step(&mut f.conn, c, RUN, Some(&last), None).unwrap();
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(camp.enqueue_cursor, ids[9]);
    assert_eq!(
        (camp.pending_upto, camp.pending_servers.as_deref()),
        (None, None),
        "intent cleared"
    );
    assert_eq!(camp.pending_intent().unwrap(), None);
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(
        (
            counters.enqueued,
            counters.jobs,
            counters.skipped,
            counters.enqueue_skipped
        ),
        (8, 2, 2, 2)
    );
    assert_eq!(ledgered(&mut f.conn, c), (0, 0, 2));
    assert_counters_match_ledger(&mut f.conn, c);

    // A skipped recipient is final: no worker ever claims it.
    let claim = deliveries::claim(&mut f.conn, c, &[ids[4], ids[9]], 1, LEASE).unwrap();
    assert!(claim.owned.is_empty());
    assert_eq!(claim.finished, 2);
}

fn finish_enqueue_makes_recipient_count_exact(kind: Kind) {
    let mut f = fixture(kind, 6);
    let c = f.campaign;
    // Members were 6 when the campaign was created; two more join the list
    // before enqueue starts, and two more while it runs.
    assert_eq!(campaigns::counters(&mut f.conn, c).unwrap().recipients, 6);
    let list_id = campaigns::get(&mut f.conn, c).unwrap().unwrap().list_id;
    import(&mut f.conn, "main", &people("late", 2), false);
    lease(&mut f.conn, c);
    campaigns::start_enqueue(&mut f.conn, c, 8).unwrap();
    assert_eq!(campaigns::counters(&mut f.conn, c).unwrap().recipients, 8);
    import(&mut f.conn, "main", &people("later", 2), false);
    let ids = member_ids(&mut f.conn, list_id);
    assert_eq!(ids.len(), 10);
    let confirm = Confirm {
        cursor: ids[9],
        enqueued: 9,
        jobs: 2,
        skipped: vec![ids[2]],
    };
    campaigns::enqueue_step(&mut f.conn, c, RUN, Some(&confirm), None).unwrap();
    // Never below what is enqueued or skipped, so `pending` never goes
    // negative while the run goes on.
    assert_eq!(campaigns::counters(&mut f.conn, c).unwrap().recipients, 10);
    campaigns::finish_enqueue(&mut f.conn, c, RUN).unwrap();
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(
        counters.recipients,
        counters.enqueued + counters.enqueue_skipped
    );
    assert_eq!(counters.recipients, 10);
    assert_eq!(counters.pending(), 9, "the skipped one is already done");
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(camp.state, CampaignState::Queued);
    assert_eq!(camp.enqueue_owner, None, "finish gives the campaign up");

    // start_enqueue only moves a draft: a queued campaign stays queued,
    // its count untouched.
    campaigns::start_enqueue(&mut f.conn, c, 99).unwrap();
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(camp.state, CampaignState::Queued);
    assert_eq!(campaigns::counters(&mut f.conn, c).unwrap().recipients, 10);
}

fn enqueue_lease_admits_one_run_at_a_time(kind: Kind) {
    let mut f = fixture(kind, 3);
    let c = f.campaign;
    let (a, b) = ("run a", "run b");
    let before = now_ms();
    assert_eq!(
        campaigns::take_enqueue_lease(&mut f.conn, c, a).unwrap(),
        None
    );
    // Taking it again is renewing it; another run sees who holds it.
    assert_eq!(
        campaigns::take_enqueue_lease(&mut f.conn, c, a).unwrap(),
        None
    );
    let held = campaigns::take_enqueue_lease(&mut f.conn, c, b)
        .unwrap()
        .expect("b must not get a's campaign");
    assert_eq!(held.owner, a);
    assert!(
        held.until >= before + campaigns::ENQUEUE_LEASE_MS,
        "{held:?}"
    );
    campaigns::renew_enqueue_lease(&mut f.conn, c, a).unwrap();
    assert!(matches!(
        campaigns::renew_enqueue_lease(&mut f.conn, c, b),
        Err(StoreError::LeaseLost(_))
    ));
    // Only the holder can give it up.
    campaigns::release_enqueue_lease(&mut f.conn, c, b).unwrap();
    assert!(campaigns::holds_enqueue_lease(&mut f.conn, c, a).unwrap());
    campaigns::release_enqueue_lease(&mut f.conn, c, a).unwrap();
    assert!(!campaigns::holds_enqueue_lease(&mut f.conn, c, a).unwrap());
    assert_eq!(
        campaigns::take_enqueue_lease(&mut f.conn, c, b).unwrap(),
        None
    );
    assert!(campaigns::holds_enqueue_lease(&mut f.conn, c, b).unwrap());
}

/// Run A stalls past its lease (a kill -9, or SIGSTOP); run B takes the
/// campaign over. Whatever A does afterwards moves nothing.
fn a_run_whose_lease_ran_out_changes_nothing(kind: Kind) {
    let mut f = fixture(kind, 4);
    let (c, ids) = (f.campaign, f.ids.clone());
    let (a, b) = ("run a", "run b");
    assert_eq!(
        campaigns::take_enqueue_lease(&mut f.conn, c, a).unwrap(),
        None
    );
    campaigns::start_enqueue(&mut f.conn, c, 4).unwrap();
    f.conn
        .execute_batch(&format!(
            "UPDATE campaigns SET enqueue_lease_until = {} WHERE id = {c}",
            now_ms() - 1
        ))
        .unwrap();
    assert_eq!(
        campaigns::take_enqueue_lease(&mut f.conn, c, b).unwrap(),
        None
    );
    let confirm = Confirm {
        cursor: ids[3],
        enqueued: 3,
        jobs: 1,
        skipped: vec![ids[0]],
    };
    let intent = Intent {
        upto: ids[3],
        servers: vec![("127.0.0.1:1".into(), 1)],
    };
    assert!(campaigns::enqueue_step(&mut f.conn, c, a, Some(&confirm), Some(&intent)).is_err());
    assert!(campaigns::enqueue_step(&mut f.conn, c, a, Some(&Confirm::default()), None).is_err());
    assert!(matches!(
        campaigns::finish_enqueue(&mut f.conn, c, a),
        Err(StoreError::LeaseLost(_))
    ));
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(
        (camp.state, camp.enqueue_cursor, camp.pending_upto),
        (CampaignState::Enqueuing, 0, None)
    );
    assert_eq!(camp.enqueue_owner.as_deref(), Some(b));
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(
        (counters.enqueued, counters.jobs, counters.skipped),
        (0, 0, 0)
    );
    assert_eq!(
        ledgered(&mut f.conn, c),
        (0, 0, 0),
        "a's skipped rows rolled back"
    );
    // B's steps go through.
    campaigns::enqueue_step(&mut f.conn, c, b, Some(&confirm), None).unwrap();
    campaigns::finish_enqueue(&mut f.conn, c, b).unwrap();
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(
        (counters.enqueued, counters.skipped, counters.recipients),
        (3, 1, 4)
    );
    assert_counters_match_ledger(&mut f.conn, c);
}

// ---------------------------------------------------------------- claims

fn fresh_claim_owns_everything(kind: Kind) {
    let mut f = fixture(kind, 8);
    let (c, ids) = (f.campaign, f.ids.clone());
    let claim = deliveries::claim(&mut f.conn, c, &ids, 11, LEASE).unwrap();
    let mut owned = claim.owned.clone();
    owned.sort();
    assert_eq!(
        owned,
        ids.iter().map(|&id| (id, 1)).collect::<Vec<_>>(),
        "attempt 1 each"
    );
    assert_eq!(claim.finished, 0);
    assert_eq!(claim.busy_until, None);
    let ledger = deliveries::ledger_counts(&mut f.conn, c).unwrap();
    assert_eq!(ledger.get(&DeliveryState::Claimed), Some(&8));

    // Claiming again with the same token is idempotent: still ours, and the
    // attempt number does not move while the lease is live.
    let again = deliveries::claim(&mut f.conn, c, &ids, 11, LEASE).unwrap();
    assert_eq!(again.owned.len(), 8);
    assert!(again.owned.iter().all(|&(_, a)| a == 1), "{again:?}");
    assert_eq!(again.busy_until, None);
}

fn second_token_owns_nothing_and_sees_busy_until(kind: Kind) {
    let mut f = fixture(kind, 6);
    let (c, ids) = (f.campaign, f.ids.clone());
    let before = now_ms();
    deliveries::claim(&mut f.conn, c, &ids[..4], 1, LEASE).unwrap();
    let other = deliveries::claim(&mut f.conn, c, &ids, 2, LEASE).unwrap();
    // Token 2 gets the two nobody held, and is told when the rest frees up.
    let mut got = owned_ids(&other);
    got.sort();
    assert_eq!(got, ids[4..].to_vec());
    assert_eq!(other.finished, 0);
    let until = other.busy_until.expect("busy_until reported");
    assert!(
        until >= before + LEASE,
        "busy_until {until} is before the lease end"
    );
    assert!(until <= now_ms() + LEASE);

    let only_busy = deliveries::claim(&mut f.conn, c, &ids[..4], 3, LEASE).unwrap();
    assert!(only_busy.owned.is_empty());
    assert_eq!(only_busy.busy_until, Some(until));
}

/// A job as a worker claims it (`claim_job`, on PostgreSQL one prepared
/// statement): whatever ids the job names, only the members of the
/// campaign's list are claimed, each once; the recipients come back with
/// what they are now (one unsubscribed since import), in id order; and a
/// second claim of the same job by another token gets nothing, told how
/// many are finished and until when the rest is held.
fn a_job_claims_only_list_members_and_reads_them(kind: Kind) {
    let mut f = fixture(kind, 5);
    let (c, ids) = (f.campaign, f.ids.clone());
    let list_id = recipients::find_list(&mut f.conn, "main").unwrap();
    let (_, _) = import(&mut f.conn, "other", &people("outsider", 2), false);
    let outsider = recipients::find_by_email(&mut f.conn, "outsider1@example.test")
        .unwrap()
        .unwrap();
    let gone = person("user3@example.test", "User 3", "unsubscribed");
    import(&mut f.conn, "main", &[gone], true);
    // Out of order, a repeat, another list's recipient and an unknown id.
    let job = [ids[3], ids[0], outsider, ids[0], i64::MAX, ids[2], ids[1]];

    let got = deliveries::claim_job(&mut f.conn, c, list_id, &job, 1, LEASE, None).unwrap();
    let members = &ids[..4];
    assert_eq!(got.members, 4, "each member once, nobody else");
    assert_eq!(
        got.claim.owned,
        members.iter().map(|&id| (id, 1)).collect::<Vec<_>>()
    );
    assert_eq!((got.claim.finished, got.claim.busy_until), (0, None));
    let read: Vec<(i64, &str, RecipientStatus)> = got
        .people
        .iter()
        .map(|r| (r.id, r.email.as_str(), r.status))
        .collect();
    assert_eq!(
        read,
        vec![
            (ids[0], "user1@example.test", RecipientStatus::Active),
            (ids[1], "user2@example.test", RecipientStatus::Active),
            (ids[2], "user3@example.test", RecipientStatus::Unsubscribed),
            (ids[3], "user4@example.test", RecipientStatus::Active),
        ]
    );
    assert_eq!(got.people[1].name, "User 2");
    assert_eq!(got.people[1].attributes, r#"{"city":"Paris"}"#);
    let ledger = deliveries::ledger_counts(&mut f.conn, c).unwrap();
    assert_eq!(ledger, BTreeMap::from([(DeliveryState::Claimed, 4)]));

    // One of them is sent; another token claims the same job meanwhile.
    let sent = outcome(&f, ids[0], 1, OutcomeKind::Sent);
    deliveries::record(&mut f.conn, &[sent], 3).unwrap();
    let before = now_ms();
    let again = deliveries::claim_job(&mut f.conn, c, list_id, &job, 2, LEASE, None).unwrap();
    assert_eq!(again.members, 4);
    assert!(again.claim.owned.is_empty(), "{again:?}");
    assert!(again.people.is_empty(), "{again:?}");
    assert_eq!(again.claim.finished, 1);
    let busy = again.claim.busy_until.expect("three are held by token 1");
    assert!(busy >= before + LEASE - 1_000, "{busy} vs {before}");
}

/// A claim that names the attributes its templates use reads only those
/// (types kept: booleans, arrays, text), however large the others are;
/// naming none reads them all.
fn a_job_reads_only_the_attributes_named(kind: Kind) {
    let mut f = fixture(kind, 2);
    let (c, ids) = (f.campaign, f.ids.clone());
    let list_id = recipients::find_list(&mut f.conn, "main").unwrap();
    let notes = "x".repeat(100_000);
    f.conn
        .execute_batch(&format!(
            "UPDATE recipients SET attributes = '{{\"city\":\"Paris\",\"vip\":true,\"off\":false,\
             \"tags\":[\"a\",\"b\"],\"price\":\"19.90\",\"notes\":\"{notes}\"}}' WHERE id = {}",
            ids[0]
        ))
        .unwrap();
    let all = deliveries::claim_job(&mut f.conn, c, list_id, &ids, 1, LEASE, None).unwrap();
    let read: serde_json::Value = serde_json::from_str(&all.people[0].attributes).unwrap();
    assert_eq!(read["notes"].as_str().map(str::len), Some(100_000));
    // The same job claimed afresh, its templates naming some attributes.
    f.conn
        .execute_batch(&format!("DELETE FROM deliveries WHERE campaign_id = {c}"))
        .unwrap();
    let keep: Vec<String> = ["city", "vip", "off", "tags", "price", "absent"]
        .map(String::from)
        .to_vec();
    let got = deliveries::claim_job(&mut f.conn, c, list_id, &ids, 2, LEASE, Some(&keep)).unwrap();
    let read: serde_json::Value = serde_json::from_str(&got.people[0].attributes).unwrap();
    assert_eq!(
        read,
        serde_json::json!({"city": "Paris", "vip": true, "off": false, "tags": ["a", "b"],
            "price": "19.90"})
    );
    let other: serde_json::Value = serde_json::from_str(&got.people[1].attributes).unwrap();
    assert_eq!(other, serde_json::json!({"city": "Paris"}));
}

/// The batch whose failures make 100 in a row pauses its campaign and says
/// so, for its worker to stop sending for it at once (not at its next look
/// at the flags, while a relay refusing everything fails more recipients).
/// The batches before it and after it (the campaign already paused) say
/// nothing.
fn a_batch_says_which_campaigns_it_paused(kind: Kind) {
    let mut f = fixture(kind, 110);
    let (c, ids) = (f.campaign, f.ids.clone());
    f.conn
        .execute_batch(&format!(
            "UPDATE campaigns SET max_failure_rate = 0.2 WHERE id = {c}"
        ))
        .unwrap();
    assert_eq!(
        deliveries::claim(&mut f.conn, c, &ids, 7, LEASE)
            .unwrap()
            .owned
            .len(),
        110
    );
    let failed: Vec<Outcome> = ids
        .iter()
        .map(|&r| {
            outcome(
                &f,
                r,
                7,
                OutcomeKind::Failed("554 5.7.1 relay denied".into()),
            )
        })
        .collect();
    let paused = |conn: &mut Conn| campaigns::flags(conn, &[c]).unwrap()[0].1.paused;
    // 99 in a row, and too few to judge a failure rate by.
    let before = deliveries::record_batch(&mut f.conn, &failed[..99], 3).unwrap();
    assert_eq!(before.results, vec![Recorded::Final; 99]);
    assert!(before.paused.is_empty(), "{before:?}");
    assert!(!paused(&mut f.conn));
    let at = deliveries::record_batch(&mut f.conn, &failed[99..100], 3).unwrap();
    assert_eq!(at.paused, vec![c]);
    assert!(paused(&mut f.conn));
    let after = deliveries::record_batch(&mut f.conn, &failed[100..], 3).unwrap();
    assert_eq!(after.results, vec![Recorded::Final; 10]);
    assert!(after.paused.is_empty(), "{after:?}");
}

/// A worker's connection keeps generic plans (planned once, not per
/// execution) only while `deliveries` is large: a plan made on a small
/// table is a sequential scan, kept as the table grows. The ledger's
/// rules hold through the switch, and a table emptied under running
/// workers (`TRUNCATE`) sends them back to custom plans.
fn generic_plans_only_while_the_ledger_is_large(kind: Kind) {
    let mut f = fixture(kind, 5);
    let (c, ids) = (f.campaign, f.ids.clone());
    let mode = |conn: &mut Conn| conn.plan_cache_mode().unwrap();
    assert!(!f.conn.generic_plans_while_large().unwrap());
    if kind == Kind::Sqlite {
        assert_eq!(mode(&mut f.conn), None, "SQLite has no plan cache mode");
        return;
    }
    assert_eq!(mode(&mut f.conn).as_deref(), Some("force_custom_plan"));
    // Another campaign's 60,000 finished rows: about 10 MB with the
    // table's fillfactor of 50, past the 8 MiB mark.
    f.conn
        .execute_batch(
            "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at) \
             SELECT 999999, g, 'sent', 1, 0 FROM generate_series(1, 60000) AS g",
        )
        .unwrap();
    // A connection looks at most every 2 s: a new one looks at once.
    let mut conn = Conn::open(&f.url).unwrap();
    assert!(conn.generic_plans_while_large().unwrap());
    assert_eq!(mode(&mut conn).as_deref(), Some("force_generic_plan"));

    // The claim and the batches of successes and failures, on generic plans.
    let claim = deliveries::claim(&mut conn, c, &ids, 7, LEASE).unwrap();
    assert_eq!(claim.owned.len(), 5);
    let mut outcomes: Vec<Outcome> = ids[..4]
        .iter()
        .map(|&r| outcome(&f, r, 7, OutcomeKind::Sent))
        .collect();
    outcomes.push(outcome(&f, ids[4], 7, OutcomeKind::Failed("550 no".into())));
    let recorded = deliveries::record(&mut conn, &outcomes, 3).unwrap();
    assert_eq!(recorded, vec![Recorded::Final; 5]);
    // A second batch of the same outcomes finds no claimed row.
    assert_eq!(
        deliveries::record(&mut conn, &outcomes[..4], 3).unwrap(),
        vec![Recorded::Lost; 4]
    );
    let counts = deliveries::ledger_counts(&mut conn, c).unwrap();
    assert_eq!(
        counts,
        BTreeMap::from([(DeliveryState::Sent, 4), (DeliveryState::Failed, 1)])
    );

    // Emptied: back to custom plans at the next look.
    f.conn.execute_batch("TRUNCATE deliveries").unwrap();
    std::thread::sleep(Duration::from_millis(2_100));
    assert!(!conn.generic_plans_while_large().unwrap());
    assert_eq!(mode(&mut conn).as_deref(), Some("force_custom_plan"));
}

fn sent_is_final_for_every_later_claim(kind: Kind) {
    let mut f = fixture(kind, 5);
    let (c, ids) = (f.campaign, f.ids.clone());
    deliveries::claim(&mut f.conn, c, &ids, 7, LEASE).unwrap();
    let outcomes: Vec<Outcome> = ids
        .iter()
        .map(|&r| outcome(&f, r, 7, OutcomeKind::Sent))
        .collect();
    let rec = deliveries::record(&mut f.conn, &outcomes, 3).unwrap();
    assert_eq!(rec, vec![Recorded::Final; 5]);
    assert_eq!(counted(&mut f.conn, c), (5, 0, 0));

    for token in [7, 8] {
        let later = deliveries::claim(&mut f.conn, c, &ids, token, LEASE).unwrap();
        assert!(
            later.owned.is_empty(),
            "token {token} re-claimed a sent recipient"
        );
        assert_eq!(later.finished, 5);
        assert_eq!(later.busy_until, None);
    }
    // Even after any lease would have run out.
    let_lease_lapse();
    let later = deliveries::claim(&mut f.conn, c, &ids, 9, -1).unwrap();
    assert!(later.owned.is_empty());
    // Recording Sent twice moves nothing.
    let rec = deliveries::record(&mut f.conn, &outcomes, 3).unwrap();
    assert!(rec.iter().all(|r| *r != Recorded::Open), "{rec:?}");
    assert_eq!(counted(&mut f.conn, c), (5, 0, 0));
    assert_counters_match_ledger(&mut f.conn, c);
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert!(counters.first_at.is_some() && counters.last_at.is_some());
}

/// A job whose recipients are partly new to the ledger and partly waiting
/// for a retry: the new ones are on their first attempt, the retried one
/// on its second, and a recipient claimed by a live token stays its own.
/// (On SQLite a claim whose every id is new skips reading back what it
/// took: this job must not be taken for one.)
fn a_job_of_new_and_retried_recipients_counts_each_attempt(kind: Kind) {
    let mut f = fixture(kind, 4);
    let (c, ids) = (f.campaign, f.ids.clone());
    let first = deliveries::claim(&mut f.conn, c, &ids[1..3], 1, LEASE).unwrap();
    assert_eq!(first.owned, vec![(ids[1], 1), (ids[2], 1)]);
    let retry = outcome(&f, ids[1], 1, OutcomeKind::Retry("451 later".into()));
    deliveries::record(&mut f.conn, &[retry], 5).unwrap();

    let job = deliveries::claim(&mut f.conn, c, &ids, 2, LEASE).unwrap();
    assert_eq!(
        job.owned,
        vec![(ids[0], 1), (ids[1], 2), (ids[3], 1)],
        "new ones on attempt 1, the retried one on 2, the held one not ours"
    );
    assert!(job.busy_until.is_some(), "{job:?}");
    let ledger = deliveries::ledger_counts(&mut f.conn, c).unwrap();
    assert_eq!(ledger, BTreeMap::from([(DeliveryState::Claimed, 4)]));
}

fn retry_reclaims_with_more_attempts_then_fails(kind: Kind) {
    let mut f = fixture(kind, 2);
    let (c, r, other) = (f.campaign, f.ids[0], f.ids[1]);
    let max = 3;
    for attempt in 1..=max {
        let claim = deliveries::claim(&mut f.conn, c, &[r], 100 + attempt as i64, LEASE).unwrap();
        assert_eq!(claim.owned, vec![(r, attempt)], "attempt {attempt}");
        let o = outcome(
            &f,
            r,
            100 + attempt as i64,
            OutcomeKind::Retry("451 later".into()),
        );
        let rec = deliveries::record(&mut f.conn, &[o], max).unwrap();
        let want = if attempt < max {
            Recorded::Open
        } else {
            Recorded::Final
        };
        assert_eq!(rec, vec![want], "attempt {attempt}");
        if attempt < max {
            assert_eq!(
                deliveries::ledger_counts(&mut f.conn, c)
                    .unwrap()
                    .get(&DeliveryState::Retry),
                Some(&1)
            );
            assert_eq!(counted(&mut f.conn, c), (0, 0, 0), "a retry is not done");
        }
    }
    assert_eq!(counted(&mut f.conn, c), (0, 1, 0));
    assert_counters_match_ledger(&mut f.conn, c);
    let failures = deliveries::failures(&mut f.conn, c, 10).unwrap();
    assert_eq!(failures, vec![(r, "451 later".to_string())]);
    let later = deliveries::claim(&mut f.conn, c, &[r], 200, LEASE).unwrap();
    assert!(later.owned.is_empty());
    assert_eq!(later.finished, 1);

    // A permanent failure is final on the first attempt.
    deliveries::claim(&mut f.conn, c, &[other], 300, LEASE).unwrap();
    let o = outcome(
        &f,
        other,
        300,
        OutcomeKind::Failed("550 no such user".into()),
    );
    assert_eq!(
        deliveries::record(&mut f.conn, &[o], max).unwrap(),
        vec![Recorded::Final]
    );
    assert_eq!(counted(&mut f.conn, c), (0, 2, 0));
    assert_counters_match_ledger(&mut f.conn, c);
}

fn unclaim_gives_the_attempt_back(kind: Kind) {
    let mut f = fixture(kind, 3);
    let (c, ids) = (f.campaign, f.ids.clone());
    deliveries::claim(&mut f.conn, c, &ids, 1, LEASE).unwrap();
    let back: Vec<Outcome> = ids
        .iter()
        .map(|&r| outcome(&f, r, 1, OutcomeKind::Unclaim))
        .collect();
    assert_eq!(
        deliveries::record(&mut f.conn, &back, 1).unwrap(),
        vec![Recorded::Open; 3]
    );
    assert_eq!(counted(&mut f.conn, c), (0, 0, 0));

    // Handed back unsent: the next claim is attempt 1 again.
    let claim = deliveries::claim(&mut f.conn, c, &ids, 2, LEASE).unwrap();
    assert_eq!(claim.owned.len(), 3);
    assert!(claim.owned.iter().all(|&(_, a)| a == 1), "{claim:?}");

    // After a real retry (attempt 1 used), an unclaim of attempt 2 restores 2.
    let retry = outcome(&f, ids[0], 2, OutcomeKind::Retry("421 busy".into()));
    assert_eq!(
        deliveries::record(&mut f.conn, &[retry], 5).unwrap(),
        vec![Recorded::Open]
    );
    let claim = deliveries::claim(&mut f.conn, c, &ids[..1], 3, LEASE).unwrap();
    assert_eq!(claim.owned, vec![(ids[0], 2)]);
    let back = outcome(&f, ids[0], 3, OutcomeKind::Unclaim);
    assert_eq!(
        deliveries::record(&mut f.conn, &[back], 5).unwrap(),
        vec![Recorded::Open]
    );
    let claim = deliveries::claim(&mut f.conn, c, &ids[..1], 4, LEASE).unwrap();
    assert_eq!(claim.owned, vec![(ids[0], 2)]);
}

fn expired_lease_is_claimable_by_another_token(kind: Kind) {
    let mut f = fixture(kind, 4);
    let (c, ids) = (f.campaign, f.ids.clone());
    // A worker that died: its lease is already over.
    let dead = deliveries::claim(&mut f.conn, c, &ids, 1, 0).unwrap();
    assert_eq!(dead.owned.len(), 4);
    let_lease_lapse();
    let heir = deliveries::claim(&mut f.conn, c, &ids, 2, LEASE).unwrap();
    let mut owned = heir.owned.clone();
    owned.sort();
    assert_eq!(
        owned,
        ids.iter().map(|&r| (r, 2)).collect::<Vec<_>>(),
        "second attempt each"
    );
    assert_eq!(heir.busy_until, None);

    // A negative lease is expired at once too.
    let mut g = fixture(kind, 2);
    let (gc, gids) = (g.campaign, g.ids.clone());
    deliveries::claim(&mut g.conn, gc, &gids, 5, -1_000).unwrap();
    let heir = deliveries::claim(&mut g.conn, gc, &gids, 6, LEASE).unwrap();
    assert_eq!(heir.owned.len(), 2);
}

fn extended_lease_is_not_claimable(kind: Kind) {
    let mut f = fixture(kind, 3);
    let (c, ids) = (f.campaign, f.ids.clone());
    deliveries::claim(&mut f.conn, c, &ids[..2], 1, 0).unwrap();
    deliveries::claim(&mut f.conn, c, &ids[2..], 3, 0).unwrap();
    // Only token 1's rows get the longer lease.
    assert_eq!(
        deliveries::extend_claims(&mut f.conn, c, 1, LEASE).unwrap(),
        2
    );
    assert_eq!(
        deliveries::extend_claims(&mut f.conn, c, 99, LEASE).unwrap(),
        0
    );
    let_lease_lapse();
    let other = deliveries::claim(&mut f.conn, c, &ids, 2, LEASE).unwrap();
    assert_eq!(
        owned_ids(&other),
        vec![ids[2]],
        "an extended lease was taken over"
    );
    assert!(other.busy_until.unwrap() > now_ms() + LEASE / 2);

    // Finished rows are not extended.
    let sent = outcome(&f, ids[0], 1, OutcomeKind::Sent);
    deliveries::record(&mut f.conn, &[sent], 3).unwrap();
    assert_eq!(
        deliveries::extend_claims(&mut f.conn, c, 1, LEASE).unwrap(),
        1
    );
}

fn stale_token_records_nothing(kind: Kind) {
    let mut f = fixture(kind, 4);
    let (c, ids) = (f.campaign, f.ids.clone());
    deliveries::claim(&mut f.conn, c, &ids, 1, -1).unwrap();
    let heir = deliveries::claim(&mut f.conn, c, &ids, 2, LEASE).unwrap();
    assert_eq!(heir.owned.len(), 4);

    // The first worker comes back from its slow send and reports.
    let stale = vec![
        outcome(&f, ids[0], 1, OutcomeKind::Sent),
        outcome(&f, ids[1], 1, OutcomeKind::Failed("550 no".into())),
        outcome(&f, ids[2], 1, OutcomeKind::Retry("451 later".into())),
        outcome(&f, ids[3], 1, OutcomeKind::Unclaim),
    ];
    assert_eq!(
        deliveries::record(&mut f.conn, &stale, 1).unwrap(),
        vec![Recorded::Lost; 4]
    );
    assert_eq!(counted(&mut f.conn, c), (0, 0, 0));
    assert_eq!(
        deliveries::ledger_counts(&mut f.conn, c)
            .unwrap()
            .get(&DeliveryState::Claimed),
        Some(&4)
    );
    // A skipped outcome with a stale token is lost too.
    let skip = outcome(&f, ids[0], 1, OutcomeKind::Skipped("unsubscribed".into()));
    assert_eq!(
        deliveries::record(&mut f.conn, &[skip], 1).unwrap(),
        vec![Recorded::Lost]
    );
    assert_eq!(counted(&mut f.conn, c), (0, 0, 0));

    // The rows still belong to the heir, who records normally.
    let mine: Vec<Outcome> = ids
        .iter()
        .map(|&r| outcome(&f, r, 2, OutcomeKind::Sent))
        .collect();
    assert_eq!(
        deliveries::record(&mut f.conn, &mine, 1).unwrap(),
        vec![Recorded::Final; 4]
    );
    assert_eq!(counted(&mut f.conn, c), (4, 0, 0));
    assert_counters_match_ledger(&mut f.conn, c);

    // One token's batch of Sent where one of its claims was lost meanwhile:
    // the live one is Final, the lost one Lost, and only one is counted.
    let mut g = fixture(kind, 2);
    let (gc, live, lost) = (g.campaign, g.ids[0], g.ids[1]);
    deliveries::claim(&mut g.conn, gc, &[live], 5, LEASE).unwrap();
    deliveries::claim(&mut g.conn, gc, &[lost], 5, -1).unwrap();
    deliveries::claim(&mut g.conn, gc, &[lost], 6, LEASE).unwrap();
    let batch = vec![
        outcome(&g, live, 5, OutcomeKind::Sent),
        outcome(&g, lost, 5, OutcomeKind::Sent),
    ];
    let rec = deliveries::record(&mut g.conn, &batch, 3).unwrap();
    assert_eq!(rec, vec![Recorded::Final, Recorded::Lost]);
    assert_eq!(counted(&mut g.conn, gc), (1, 0, 0));
    assert_counters_match_ledger(&mut g.conn, gc);
}

fn counters_equal_ledger_after_mixed_outcomes(kind: Kind) {
    let mut f = fixture(kind, 12);
    let (c, ids) = (f.campaign, f.ids.clone());
    lease(&mut f.conn, c);
    campaigns::start_enqueue(&mut f.conn, c, 12).unwrap();
    let confirm = Confirm {
        cursor: ids[11],
        enqueued: 11,
        jobs: 2,
        skipped: vec![ids[11]],
    };
    campaigns::enqueue_step(&mut f.conn, c, RUN, Some(&confirm), None).unwrap();
    campaigns::finish_enqueue(&mut f.conn, c, RUN).unwrap();

    let job = &ids[..11];
    let claim = deliveries::claim(&mut f.conn, c, job, 1, LEASE).unwrap();
    assert_eq!(claim.owned.len(), 11);
    let kinds = [
        OutcomeKind::Sent,
        OutcomeKind::Sent,
        OutcomeKind::Sent,
        OutcomeKind::Failed("550 unknown user".into()),
        OutcomeKind::Failed("553 bad address".into()),
        OutcomeKind::Skipped("unsubscribed since enqueue".into()),
        OutcomeKind::Retry("451 later".into()),
        OutcomeKind::Retry("451 later".into()),
        OutcomeKind::Unclaim,
        OutcomeKind::Sent,
    ];
    let outcomes: Vec<Outcome> = job
        .iter()
        .zip(kinds)
        .map(|(&r, k)| outcome(&f, r, 1, k))
        .collect();
    // ids[10] is left claimed (in flight).
    let rec = deliveries::record(&mut f.conn, &outcomes, 1).unwrap();
    assert_eq!(
        rec,
        vec![
            Recorded::Final,
            Recorded::Final,
            Recorded::Final,
            Recorded::Final,
            Recorded::Final,
            Recorded::Final,
            Recorded::Final, // Retry on the last allowed attempt: failed
            Recorded::Final,
            Recorded::Open,
            Recorded::Final,
        ]
    );
    assert_eq!(counted(&mut f.conn, c), (4, 4, 2));
    assert_counters_match_ledger(&mut f.conn, c);
    let ledger = deliveries::ledger_counts(&mut f.conn, c).unwrap();
    assert_eq!(ledger.get(&DeliveryState::Retry), Some(&1));
    assert_eq!(ledger.get(&DeliveryState::Claimed), Some(&1));

    // Second round with max_attempts = 3: the handed-back one retries, the
    // in-flight one is sent.
    let claim = deliveries::claim(&mut f.conn, c, job, 2, LEASE).unwrap();
    assert_eq!(owned_ids(&claim), vec![ids[8]]);
    assert_eq!(claim.finished, 10 - 1);
    assert!(
        claim.busy_until.is_some(),
        "ids[10] is still held by token 1"
    );
    let round = vec![
        outcome(&f, ids[8], 2, OutcomeKind::Retry("421 busy".into())),
        outcome(&f, ids[10], 1, OutcomeKind::Sent),
    ];
    assert_eq!(
        deliveries::record(&mut f.conn, &round, 3).unwrap(),
        vec![Recorded::Open, Recorded::Final]
    );
    assert_eq!(counted(&mut f.conn, c), (5, 4, 2));
    assert_counters_match_ledger(&mut f.conn, c);
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(counters.recipients, 12);
    assert_eq!(counters.done(), 11);
    assert_eq!(counters.pending(), 1);

    // The observed rate: pretend the rate window opened 10 s ago with 5 done,
    // then record 1 more: (11 - 5) done in ~10 s. The rate SQL is raw text,
    // so both dialects' arithmetic is checked here.
    assert!(
        counters.window_at > 0,
        "the first record opens the rate window"
    );
    let ten_s_ago = now_ms() - 10_000;
    f.conn
        .execute_batch(&format!(
            "UPDATE campaign_counters SET window_at = {ten_s_ago}, window_done = 5 \
             WHERE campaign_id = {c}"
        ))
        .unwrap();
    deliveries::claim(&mut f.conn, c, &ids[8..9], 3, LEASE).unwrap();
    let o = outcome(&f, ids[8], 3, OutcomeKind::Sent);
    deliveries::record(&mut f.conn, &[o], 3).unwrap();
    let counters = campaigns::counters(&mut f.conn, c).unwrap();
    assert_eq!(counters.done(), 12);
    assert_eq!(counters.window_done, 12);
    assert!(counters.window_at >= ten_s_ago + 10_000);
    assert!(
        (0.6..=0.71).contains(&counters.rate),
        "rate {} is not ~7 per 10 s",
        counters.rate
    );
    assert_counters_match_ledger(&mut f.conn, c);
}

fn concurrent_claims_send_each_recipient_once(kind: Kind) {
    const N: usize = 200;
    const JOB: usize = 50;
    const THREADS: usize = 4;
    let f = fixture(kind, N);
    let (c, ids, url) = (f.campaign, f.ids.clone(), f.url.clone());
    // Jobs of 50 starting every 25 recipients (wrapping), so each recipient
    // is in two jobs; every thread walks all jobs from its own offset.
    let jobs: Vec<Vec<i64>> = (0..N / 25)
        .map(|j| {
            let mut job: Vec<i64> = (0..JOB).map(|k| ids[(j * 25 + k) % N]).collect();
            job.sort();
            job
        })
        .collect();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (url, jobs) = (url.clone(), jobs.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::open(&url).unwrap();
                let mut sent = Vec::new();
                let mut finals = 0usize;
                for j in 0..jobs.len() {
                    let job = &jobs[(j + t) % jobs.len()];
                    let token = (t * 1_000 + j + 1) as i64;
                    // A job comes back while someone else holds part of it.
                    for round in 0.. {
                        assert!(round < 2_000, "job never settled");
                        let claim = deliveries::claim(&mut conn, c, job, token, LEASE)
                            .unwrap_or_else(|e| panic!("thread {t} claim: {e}"));
                        let outcomes: Vec<Outcome> = claim
                            .owned
                            .iter()
                            .map(|&(rid, _)| Outcome {
                                campaign_id: c,
                                recipient_id: rid,
                                token,
                                kind: OutcomeKind::Sent,
                                content_version: None,
                            })
                            .collect();
                        let rec = deliveries::record(&mut conn, &outcomes, 3)
                            .unwrap_or_else(|e| panic!("thread {t} record: {e}"));
                        assert!(rec.iter().all(|r| *r == Recorded::Final), "{rec:?}");
                        finals += rec.len();
                        sent.extend(owned_ids(&claim));
                        if claim.busy_until.is_none() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                (sent, finals)
            })
        })
        .collect();
    let mut all_sent = Vec::new();
    let mut finals = 0;
    for h in handles {
        let (sent, n) = h.join().expect("a claiming thread panicked");
        all_sent.extend(sent);
        finals += n;
    }
    assert_eq!(finals, N);
    assert_eq!(all_sent.len(), N, "some recipient was sent twice or never");
    let unique: BTreeSet<i64> = all_sent.iter().copied().collect();
    assert_eq!(unique, ids.iter().copied().collect::<BTreeSet<_>>());
    let mut conn = Conn::open(&url).unwrap();
    assert_eq!(counted(&mut conn, c), (N as i64, 0, 0));
    assert_eq!(ledgered(&mut conn, c), (N as i64, 0, 0));
    let ledger = deliveries::ledger_counts(&mut conn, c).unwrap();
    assert_eq!(ledger.values().sum::<i64>(), N as i64, "{ledger:?}");
}

fn empty_inputs_are_no_ops(kind: Kind) {
    let mut f = fixture(kind, 2);
    let c = f.campaign;
    let claim = deliveries::claim(&mut f.conn, c, &[], 1, LEASE).unwrap();
    assert_eq!(claim, Claim::default());
    assert!(deliveries::record(&mut f.conn, &[], 3).unwrap().is_empty());
    assert!(recipients::load(&mut f.conn, &[]).unwrap().is_empty());
    assert!(campaigns::flags(&mut f.conn, &[]).unwrap().is_empty());
    lease(&mut f.conn, c);
    campaigns::enqueue_step(&mut f.conn, c, RUN, Some(&Confirm::default()), None).unwrap();
    assert_eq!(counted(&mut f.conn, c), (0, 0, 0));
    assert!(deliveries::ledger_counts(&mut f.conn, c)
        .unwrap()
        .is_empty());
}

/// A batch of successes only (on PostgreSQL one statement per campaign,
/// without BEGIN and COMMIT): two campaigns and, in one of them, two jobs'
/// tokens and a claim lost meanwhile. Each campaign counts exactly its own
/// rows, the lost one reads `Lost` and is not counted, and the success ends
/// the campaign's failure streak (the auto-pause bookkeeping moves as in a
/// mixed batch).
fn a_batch_of_successes_counts_each_campaign_and_ends_a_failure_streak(kind: Kind) {
    let mut f = fixture(kind, 6);
    let (news, ids) = (f.campaign, f.ids.clone());
    let list_id = recipients::get_or_create_list(&mut f.conn, "main").unwrap();
    let promo = new_campaign(&mut f.conn, "promo", list_id).id;
    deliveries::claim(&mut f.conn, news, &ids[..2], 1, LEASE).unwrap();
    deliveries::claim(&mut f.conn, news, &ids[2..4], 2, LEASE).unwrap();
    // ids[4]: token 3's claim ran out and token 4 holds it now.
    deliveries::claim(&mut f.conn, news, &ids[4..5], 3, -1).unwrap();
    deliveries::claim(&mut f.conn, news, &ids[4..5], 4, LEASE).unwrap();
    deliveries::claim(&mut f.conn, promo, &ids, 7, LEASE).unwrap();

    // Three failures in a row in news first.
    let failures: Vec<Outcome> = ids[..3]
        .iter()
        .map(|&r| {
            let token = if r == ids[2] { 2 } else { 1 };
            outcome(
                &f,
                r,
                token,
                OutcomeKind::Failed("550 5.7.1 blocked".into()),
            )
        })
        .collect();
    deliveries::record(&mut f.conn, &failures, 3).unwrap();
    assert_eq!(
        campaigns::counters(&mut f.conn, news).unwrap().fail_streak,
        3
    );
    // Then a batch of successes: news' ids[3] (token 2) and the stale
    // ids[4] (token 3), interleaved with promo's ids[0..3] (token 7).
    let on = |campaign: i64, rid: i64, token: i64| Outcome {
        campaign_id: campaign,
        recipient_id: rid,
        token,
        kind: OutcomeKind::Sent,
        content_version: None,
    };
    let batch = vec![
        on(promo, ids[0], 7),
        on(news, ids[3], 2),
        on(promo, ids[1], 7),
        on(news, ids[4], 3),
        on(promo, ids[2], 7),
    ];
    assert_eq!(
        deliveries::record(&mut f.conn, &batch, 3).unwrap(),
        vec![
            Recorded::Final,
            Recorded::Final,
            Recorded::Final,
            Recorded::Lost,
            Recorded::Final
        ]
    );
    assert_eq!(counted(&mut f.conn, news), (1, 3, 0));
    assert_eq!(counted(&mut f.conn, promo), (3, 0, 0));
    let c = campaigns::counters(&mut f.conn, news).unwrap();
    assert_eq!((c.fail_streak, c.recent_done, c.recent_failed), (0, 4, 3));
    assert!(c.last_at.is_some());
    assert_counters_match_ledger(&mut f.conn, news);
    assert_counters_match_ledger(&mut f.conn, promo);
    // The heir of ids[4] still records it.
    assert_eq!(
        deliveries::record(&mut f.conn, &[on(news, ids[4], 4)], 3).unwrap(),
        vec![Recorded::Final]
    );
    assert_eq!(counted(&mut f.conn, news), (2, 3, 0));
}

// ------------------------------------------------- stale claims and nesting

/// Worker A's lease ran out mid-send; B re-claimed, sent and recorded. When
/// A finally reports Sent, its claim is gone: the outcome changed nothing
/// and must read as `Lost` (as a stale Failed/Retry/Skipped does), not
/// `Final`.
fn stale_sent_after_other_token_sent_is_lost(kind: Kind) {
    let mut f = fixture(kind, 1);
    let (c, r) = (f.campaign, f.ids[0]);
    deliveries::claim(&mut f.conn, c, &[r], 1, -1).unwrap();
    deliveries::claim(&mut f.conn, c, &[r], 2, LEASE).unwrap();
    let b = outcome(&f, r, 2, OutcomeKind::Sent);
    assert_eq!(
        deliveries::record(&mut f.conn, &[b], 3).unwrap(),
        vec![Recorded::Final]
    );
    // A stale Failed is Lost here, as documented...
    let a_failed = outcome(&f, r, 1, OutcomeKind::Failed("550".into()));
    assert_eq!(
        deliveries::record(&mut f.conn, &[a_failed], 3).unwrap(),
        vec![Recorded::Lost]
    );
    // ...and so must a stale Sent be.
    let a_sent = outcome(&f, r, 1, OutcomeKind::Sent);
    assert_eq!(
        deliveries::record(&mut f.conn, &[a_sent], 3).unwrap(),
        vec![Recorded::Lost]
    );
    assert_eq!(counted(&mut f.conn, c), (1, 0, 0));
}

/// Store functions compose inside one `Conn::transaction`: their own
/// transactions nest as savepoints, so the caller's rollback undoes them
/// (a plain nested BEGIN would fail on SQLite and, on PostgreSQL, commit the
/// caller's work early).
fn store_functions_compose_inside_one_transaction(kind: Kind) {
    let mut f = fixture(kind, 3);
    let (c, ids) = (f.campaign, f.ids.clone());
    lease(&mut f.conn, c);
    let result: Result<(), StoreError> = f.conn.transaction(|conn| {
        campaigns::start_enqueue(conn, c, 3)?;
        let confirm = Confirm {
            cursor: ids[2],
            enqueued: 3,
            jobs: 1,
            skipped: vec![],
        };
        campaigns::enqueue_step(conn, c, RUN, Some(&confirm), None)?;
        // The caller changes its mind: everything above must roll back.
        Err(StoreError::Task("caller aborts".into()))
    });
    match result {
        Err(StoreError::Task(m)) => assert_eq!(m, "caller aborts"),
        other => panic!("the nested store call failed instead of composing: {other:?}"),
    }
    let camp = campaigns::get(&mut f.conn, c).unwrap().unwrap();
    assert_eq!(
        camp.state,
        CampaignState::Draft,
        "start_enqueue survived a rollback"
    );
    assert_eq!(camp.enqueue_cursor, 0, "enqueue_step survived a rollback");
    assert_eq!(campaigns::counters(&mut f.conn, c).unwrap().enqueued, 0);
}
