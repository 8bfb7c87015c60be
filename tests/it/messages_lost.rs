//! Messages whose beanstalkd jobs were lost, and the bands message jobs
//! travel in. Against the real binary, beanstalkd, the scripted SMTP
//! peer, SQLite and PostgreSQL: API messages and a flow's due steps
//! stored, then beanstalkd restarted empty before any worker ran, are
//! each sent exactly once by the lease holder's sweep (a lapsed `sending`
//! claim failed, never sent twice); a message put back for a retry is
//! not put again before its delay ends, and its job keeps its band; a
//! backlog of flow batches waiting their turn is not put twice, nor a
//! batch a worker reserved and has not yet claimed; a ready
//! transactional job is reserved before a flow batch, and both before a
//! campaign's.

use std::io::Write;

use mailsplit::flows::scheduler;
use mailsplit::messages::sweep::{self, Suspects, Sweep};
use mailsplit::messages::{self, AskedBy, Queue, Submit};
use mailsplit::store::messages::{find, MessageStatus};
use mailsplit::store::now_ms;

use crate::util::*;

/// Grace period of the sweep in these tests (it sweeps every half of it).
const GRACE_MS: &str = "1000";

/// Migrate; template `order` (transactional) and `welcome` (marketing,
/// a flow's step).
fn templates(env: &Env) {
    env.ok(&["migrate"]);
    let html = env.dir.path().join("t.html");
    std::fs::write(&html, "<p>Hello {{ name | default('friend') }}</p>\n").unwrap();
    let f = html.to_str().unwrap();
    for (name, stream) in [("order", "transactional"), ("welcome", "marketing")] {
        env.ok(&[
            "template",
            "create",
            name,
            "--subject",
            name,
            "--from",
            "shop@example.test",
            "--html",
            f,
            "--stream",
            stream,
        ]);
    }
}

/// Flow `welcome` on list `news`: its one step goes out at once.
fn flow(env: &Env) {
    env.ok(&[
        "flow",
        "create",
        "welcome",
        "--list",
        "news",
        "--trigger",
        "join",
        "--step",
        "0:welcome",
    ]);
}

/// Import `emails` into list `news` (they enter the flow).
fn join(env: &Env, emails: &[String]) {
    let path = env.dir.path().join(format!("join-{}.csv", free_port()));
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "email").unwrap();
    for e in emails {
        writeln!(f, "{e}").unwrap();
    }
    drop(f);
    env.ok(&["import", path.to_str().unwrap(), "--list", "news"]);
}

fn queue(env: &Env) -> Queue {
    Queue {
        servers: vec![env.beanstalkd.parse().unwrap()],
        tube: env.tube.clone(),
    }
}

/// What the lease holder's scheduler does, run here before any worker:
/// the due steps stored as messages and their jobs put, in batches until
/// none is due; how many.
fn schedule_due_steps(env: &Env) -> usize {
    let mut conn = env.conn();
    let mut total = 0;
    loop {
        let n = scheduler::batch(&mut conn, &queue(env), now_ms()).unwrap();
        if n == 0 {
            return total;
        }
        total += n;
    }
}

/// `send order --to TO`: the message's id.
fn send(env: &Env, to: &str) -> i64 {
    let out = env.ok(&["send", "order", "--to", to, "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    v["id"].as_i64().unwrap()
}

fn message(env: &Env, id: i64) -> mailsplit::store::messages::Message {
    find(&mut env.conn(), id).unwrap().unwrap()
}

/// When message `id`'s next attempt is due (ms).
fn next_attempt_at(env: &Env, id: i64) -> i64 {
    let rows = env.text_pairs(&format!(
        "SELECT CAST(next_attempt_at AS TEXT) AS a, status AS b FROM messages WHERE id = {id}"
    ));
    rows[0].0.parse().unwrap()
}

/// Messages per status.
fn statuses(env: &Env) -> std::collections::BTreeMap<String, i64> {
    env.text_pairs("SELECT status AS a, CAST(COUNT(*) AS TEXT) AS b FROM messages GROUP BY status")
        .into_iter()
        .map(|(s, n)| (s, n.parse().unwrap()))
        .collect()
}

/// Messages the sweep put again, by its log lines.
fn put_again(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("messages put again: their jobs were lost"))
        .map(|l| {
            let at = l.find(" put=").expect("a put= field") + 5;
            l[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// Stop a worker whose log is followed: SIGTERM, a clean exit.
fn stop(mut w: Proc, log: &Log) {
    signal(&w.0, "TERM");
    let status = wait_exit(&mut w.0, 30);
    assert!(status.success(), "worker exited {status}:\n{}", log.text());
}

/// (a) 150 flow steps (two batch jobs) and three API messages are
/// stored; one API message's worker died holding its claim, another's
/// after handing it to the relay; beanstalkd then restarts empty. A
/// worker with a short grace period sends every message exactly once,
/// fails the one in doubt, and leaves nothing waiting.
fn lost_jobs_are_put_again(kind: Kind) {
    let mut env = World::with_peer(kind, Script::default())
        .var("MAILSPLIT_SWEEP_GRACE_MS", GRACE_MS)
        .var("MAILSPLIT_FLOW_TICK_MS", "200");
    templates(&env);
    flow(&env);
    let members: Vec<String> = (1..=150).map(|i| format!("m{i}@example.test")).collect();
    join(&env, &members);
    assert_eq!(schedule_due_steps(&env), 150);
    let tx: Vec<i64> = (1..=3)
        .map(|i| send(&env, &format!("tx{i}@example.org")))
        .collect();
    assert_eq!(env.bs.live_jobs(&env.tube), 2 + 3);
    // tx2's worker died holding its claim, tx3's with the message at the
    // relay (whether it went is unknown): both claims long lapsed.
    for (id, status) in [(tx[1], "claimed"), (tx[2], "sending")] {
        env.sql(&format!(
            "UPDATE messages SET status = '{status}', claim_token = 7, claimed_until = 1, \
             attempts = 1 WHERE id = {id}"
        ));
    }
    // beanstalkd restarted without its binlog, before any worker ran.
    env.bs.restart_empty();
    assert_eq!(env.bs.live_jobs(&env.tube), 0);

    let mut w = env.worker(&[]);
    let log = Log::follow(&mut w.0);
    log.wait_line(60, "messages put again: their jobs were lost");
    wait_for(60, "every message sent or failed", || {
        let s = statuses(&env);
        s.get("sent") == Some(&152) && s.get("failed") == Some(&1)
    });
    stop(w, &log);
    let peer = env.peer();
    for addr in members
        .iter()
        .map(String::as_str)
        .chain(["tx1@example.org", "tx2@example.org"])
    {
        assert_eq!(peer.count(addr), 1, "{addr}");
    }
    assert_eq!(
        peer.count("tx3@example.org"),
        0,
        "the message in doubt went out again"
    );
    assert_eq!(peer.total(), 152);
    let doubt = message(&env, tx[2]);
    assert_eq!(doubt.status, MessageStatus::Failed);
    assert!(
        doubt
            .reply
            .as_deref()
            .unwrap_or("")
            .contains("never sent twice"),
        "{doubt:?}"
    );
    // Each one put once: nothing whose job came back was put a second time.
    assert_eq!(put_again(&log.text()), 153, "{}", log.text());
    let s = statuses(&env);
    assert_eq!(s.keys().collect::<Vec<_>>(), ["failed", "sent"], "{s:?}");
}

/// (b) A flow step and an API message each get a 4xx and go back for a
/// retry 64 s later (their sixth try). Once their claims lapsed, a message
/// stored without a job is put again by the sweep and sent: that sweep
/// looked at the two as well, and put neither early (one try each, their
/// delayed jobs the only ones). Each delayed job waits in its own band.
fn a_retry_waits_out_its_delay(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            tempfail: Some(("retry".into(), 1)),
            ..Script::default()
        },
    )
    .var("MAILSPLIT_SWEEP_GRACE_MS", GRACE_MS)
    .var("MAILSPLIT_LEASE_MS", "3000")
    .var("MAILSPLIT_FLOW_TICK_MS", "200");
    let peer = env.peer();
    templates(&env);
    flow(&env);
    join(&env, &["retry-flow@example.org".to_string()]);
    assert_eq!(schedule_due_steps(&env), 1);
    let tx = send(&env, "retry-tx@example.org");
    // Their next try is their sixth: a 4xx puts them back for 64 s.
    env.sql("UPDATE messages SET attempts = 5");
    let ids: Vec<i64> = env
        .text_pairs("SELECT CAST(id AS TEXT) AS a, to_addr AS b FROM messages ORDER BY id")
        .into_iter()
        .map(|(id, _)| id.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&tx));

    let mut w = env.worker(&["--max-attempts", "10"]);
    let log = Log::follow(&mut w.0);
    let tries = |addr: &str| *peer.tries.lock().unwrap().get(addr).unwrap_or(&0);
    wait_for(60, "both tried once and put back for a retry", || {
        ids.iter().all(|&id| {
            let m = message(&env, id);
            m.status == MessageStatus::Queued && m.attempts == 6
        }) && env.bs.tube_stat(&env.tube, "current-jobs-delayed") == 2
    });
    // Their claims lapse: from here only their delays keep the sweep off.
    wait_for(30, "their claims to lapse", || {
        ids.iter()
            .all(|&id| message(&env, id).claimed_until < now_ms())
    });
    let lost = messages::submit::store(
        &mut env.conn(),
        Submit {
            template: "order".into(),
            to: "lost@example.org".into(),
            data: None,
            idempotency_key: None,
        },
        AskedBy::Sender,
    )
    .unwrap()
    .submitted
    .id;
    let stat = |k| env.bs.tube_stat(&env.tube, k);
    let jobs = || {
        (
            stat("current-jobs-delayed"),
            stat("current-jobs-ready"),
            stat("current-jobs-reserved"),
        )
    };
    wait_for(60, "the message without a job sent, its job done", || {
        message(&env, lost).status == MessageStatus::Sent && jobs() == (2, 0, 0)
    });
    assert_eq!(peer.count("lost@example.org"), 1);
    for (id, addr) in ids
        .iter()
        .zip(["retry-flow@example.org", "retry-tx@example.org"])
    {
        let m = message(&env, *id);
        assert_eq!(
            (m.status, m.attempts, tries(addr)),
            (MessageStatus::Queued, 6, 1),
            "{addr} was tried again before its delay"
        );
        assert!(next_attempt_at(&env, *id) > now_ms() + 30_000, "{m:?}");
    }
    assert_eq!(jobs(), (2, 0, 0));
    stop(w, &log);
    assert_eq!(put_again(&log.text()), 1, "{}", log.text());
    // The delayed jobs, made ready and taken in order: each in its band.
    let mut c = env.bs.client();
    c.use_tube(&env.tube).unwrap();
    assert_eq!(c.kick(10).unwrap(), 2);
    let jobs = env.bs.drain(&env.tube);
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(jobs[0].0, 0, "{jobs:?}");
    assert!(!jobs[0].1.contains("band"), "{jobs:?}");
    assert_eq!(jobs[1].0, 1, "{jobs:?}");
    assert!(jobs[1].1.contains(r#""band":"flow""#), "{jobs:?}");
}

/// 500 flow steps (five batch jobs) wait for one worker with one SMTP
/// session and a relay that takes 20 ms a message: once the worker holds
/// three batches, the last two wait several grace periods for their turn
/// at the head of the queue, and are not put again (the tube's job count
/// stays five). Its grace periods are seconds long: alone on the machine
/// (a loaded machine stretches a sweep's reads past them).
fn a_backlog_is_not_put_twice(kind: Kind) {
    let _alone = crate::util::alone();
    let env = World::with_peer(
        kind,
        Script {
            data_delay: std::time::Duration::from_millis(20),
            ..Script::default()
        },
    )
    .var("MAILSPLIT_SWEEP_GRACE_MS", "2000")
    .var("MAILSPLIT_FLOW_TICK_MS", "200");
    let peer = env.peer();
    templates(&env);
    flow(&env);
    let members: Vec<String> = (1..=500).map(|i| format!("b{i}@example.test")).collect();
    join(&env, &members);
    // The test holds the scheduler's lease while it schedules the steps
    // and the worker takes its first three batches: the sweep starts on a
    // backlog, not on a worker still claiming what it just reserved.
    let lease = |c: &mut mailsplit::store::Conn| {
        let now = now_ms();
        mailsplit::store::flows::lease(c, "test", now, now + 120_000).unwrap()
    };
    assert!(lease(&mut env.conn()));
    let mut w = env.worker(&["--concurrency", "1"]);
    let log = Log::follow(&mut w.0);
    assert_eq!(schedule_due_steps(&env), 500);
    assert_eq!(env.bs.tube_stat(&env.tube, "total-jobs"), 5);
    wait_for(60, "three batches claimed, two waiting", || {
        let s = statuses(&env);
        s.get("queued") == Some(&200) && env.bs.tube_stat(&env.tube, "current-jobs-ready") == 2
    });
    mailsplit::store::flows::release(&mut env.conn(), "test").unwrap();
    log.wait_line(30, "this worker holds the lease");
    wait_for(120, "every step sent", || peer.total() == 500);
    // The last batch waited its turn well past the grace period.
    let waited = now_ms() - next_attempt_at(&env, 500);
    assert!(
        waited > 4_000,
        "the backlog drained too fast to say ({waited} ms)"
    );
    stop(w, &log);
    assert_eq!(peer.duplicates(), 0);
    assert_eq!(put_again(&log.text()), 0, "{}", log.text());
    assert_eq!(env.bs.tube_stat(&env.tube, "total-jobs"), 5);
}

/// One sweep of the messages due before `before` (their grace period
/// over), after the one that found `suspects`: the next sweep's suspects,
/// and how many messages it put again.
fn sweep_now(env: &Env, suspects: Suspects, before: i64) -> (Suspects, usize) {
    let q = queue(env);
    let waited = sweep::queue_wait(&q).unwrap();
    assert_eq!(waited, Some(std::time::Duration::ZERO), "nothing ready");
    let mut pass = Sweep::new(suspects, now_ms(), before);
    let mut conn = env.conn();
    while pass.step(&mut conn, &q).unwrap() {}
    let put = pass.put;
    (pass.suspects(), put)
}

/// A moment after every message stored so far was due (ms).
fn a_moment_later() -> i64 {
    std::thread::sleep(std::time::Duration::from_millis(5));
    now_ms()
}

/// A flow batch a worker has reserved and not yet claimed is neither
/// ready on the queue nor in a claim: the first sweep that finds its
/// messages waiting only suspects them (their job may be on its way to a
/// claim); the next sweep puts the jobs of those still waiting. Here the
/// worker claimed 40 of the hundred in between, then beanstalkd lost the
/// job: the 60 others are put again, in one job, and the 40 are not.
fn a_reserved_batch_is_suspected_before_it_is_put(kind: Kind) {
    let mut env = World::new(kind);
    templates(&env);
    flow(&env);
    let members: Vec<String> = (1..=100).map(|i| format!("r{i}@example.test")).collect();
    join(&env, &members);
    assert_eq!(schedule_due_steps(&env), 100);
    // A worker's reservation, never claimed.
    let mut c = env.bs.client();
    c.watch(&env.tube).unwrap();
    let _held = c
        .reserve_with_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    assert_eq!(env.bs.tube_stat(&env.tube, "current-jobs-ready"), 0);
    let (suspects, put) = sweep_now(&env, Suspects::default(), a_moment_later());
    assert_eq!((put, suspects.len()), (0, 100));
    assert_eq!(env.bs.tube_stat(&env.tube, "total-jobs"), 1);
    // The worker claims 40 (a live claim); then the job is lost.
    env.sql(&format!(
        "UPDATE messages SET status = 'claimed', claim_token = 7, claimed_until = {} \
         WHERE id IN (SELECT id FROM messages ORDER BY id LIMIT 40)",
        now_ms() + 600_000
    ));
    drop(c);
    env.bs.restart_empty();
    let second = a_moment_later();
    let (suspects, put) = sweep_now(&env, suspects, second);
    assert_eq!((put, suspects.len()), (60, 0));
    let jobs = env.bs.drain(&env.tube);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0].1.contains(r#""band":"flow""#), "{jobs:?}");
    // Put again, each waits a grace period from the put: a sweep whose
    // grace period ends before it suspects none of them.
    let (suspects, put) = sweep_now(&env, suspects, second);
    assert_eq!((put, suspects.len()), (0, 0));
}

/// (c) A campaign's job, a flow's batch and an API message's job are put
/// in that order; they are reserved the other way round: the message
/// (priority 0), the flow batch (1), the campaign (clamped to 2 and
/// beyond, even at `--priority 1`).
fn transactional_before_flows_before_campaigns(kind: Kind) {
    let env = World::new(kind);
    templates(&env);
    env.import_n("big", 5);
    env.create_campaign("big", "big", &["--priority", "1"]);
    env.ok(&["enqueue", "big"]);
    flow(&env);
    join(
        &env,
        &["f1@example.test".to_string(), "f2@example.test".to_string()],
    );
    assert_eq!(schedule_due_steps(&env), 2);
    send(&env, "tx@example.org");
    let jobs = env.bs.drain(&env.tube);
    let seen: Vec<(u32, &str)> = jobs
        .iter()
        .map(|(pri, body)| {
            let kind = if body.contains(r#""band":"flow""#) {
                "flow"
            } else if body.contains(r#""message""#) {
                "transactional"
            } else {
                "campaign"
            };
            (*pri, kind)
        })
        .collect();
    assert_eq!(
        seen,
        [(0, "transactional"), (1, "flow"), (2, "campaign")],
        "{jobs:?}"
    );
}

/// 5,000 messages, one in a thousand `queued` and the others `sent`, the
/// planner's statistics fresh.
fn a_ledger_mostly_sent(env: &Env, kind: Kind) {
    env.ok(&["migrate"]);
    let rows = "INSERT INTO messages (template_id, template_name, to_addr, data, body_hash, \
                status, created_at, next_attempt_at) \
                SELECT 1, 'order', 'a@example.org', '{}', '', \
                CASE WHEN i % 1000 = 0 THEN 'queued' ELSE 'sent' END, i, i FROM n";
    env.sql(&match kind {
        Kind::Sqlite => format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) \
             {rows}; ANALYZE"
        ),
        Kind::Postgres => {
            format!("WITH n(i) AS (SELECT generate_series(1, 5000)) {rows}; ANALYZE messages")
        }
    });
}

/// The sweep's query for each status in flight reads the index on
/// (status, next_attempt_at), not the ledger (on PostgreSQL its generic
/// plan, made without the bound values).
fn the_sweep_reads_the_index(kind: Kind) {
    let env = World::new(kind);
    a_ledger_mostly_sent(&env, kind);
    for status in [
        MessageStatus::Queued,
        MessageStatus::Claimed,
        MessageStatus::Sending,
    ] {
        let plan = mailsplit::store::messages_sweep::lost_plan(&mut env.conn(), status).unwrap();
        assert!(
            plan.contains("messages_by_next_attempt"),
            "{status}: {plan}"
        );
        assert!(
            !plan.contains("SCAN messages") && !plan.contains("Seq Scan"),
            "{status}: {plan}"
        );
    }
}

/// The sweep's index holds the messages in flight only: the 4,995 sent
/// have no entry (SQLite: the cells of its B-tree; PostgreSQL: a
/// partial index, on the pages of 5 entries, not of 5,000), and a message
/// that gets its outcome leaves it.
fn a_sent_message_has_no_entry_in_the_sweeps_index(kind: Kind) {
    let env = World::new(kind);
    a_ledger_mostly_sent(&env, kind);
    let one = |sql: &str| -> i64 {
        let rows = env.text_pairs(sql);
        rows[0].0.parse().unwrap()
    };
    match kind {
        Kind::Sqlite => {
            // Every cell of an index's B-tree, leaf or interior, is an entry.
            let entries = "SELECT CAST(coalesce(sum(ncell), 0) AS TEXT) AS a, '' AS b \
                           FROM dbstat WHERE name = 'messages_by_next_attempt'";
            assert_eq!(one(entries), 5);
            env.sql("UPDATE messages SET status = 'sent' WHERE id = 1000");
            assert_eq!(one(entries), 4);
        }
        Kind::Postgres => {
            let partial = "SELECT CAST(indpred IS NOT NULL AS TEXT) AS a, '' AS b FROM pg_index \
                           WHERE indexrelid = 'messages_by_next_attempt'::regclass";
            assert_eq!(env.text_pairs(partial)[0].0, "true");
            // A B-tree's meta page and one leaf: 5,000 entries need ~18.
            let pages = "SELECT CAST(pg_relation_size('messages_by_next_attempt') \
                         / current_setting('block_size')::int AS TEXT) AS a, '' AS b";
            assert!(one(pages) <= 2, "{} pages", one(pages));
        }
    }
}

both!(
    the_sweep_reads_the_index,
    a_sent_message_has_no_entry_in_the_sweeps_index,
    lost_jobs_are_put_again,
    a_retry_waits_out_its_delay,
    a_backlog_is_not_put_twice,
    a_reserved_batch_is_suspected_before_it_is_put,
    transactional_before_flows_before_campaigns,
);
