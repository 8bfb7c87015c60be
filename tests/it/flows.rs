//! Flows (issue 39): a welcome series on a list. Against the real binary,
//! beanstalkd, the scripted SMTP peer, SQLite and PostgreSQL: every new
//! member gets step 1 then step 2, exactly once, while the worker holding
//! the scheduler's lease is killed with -9 between them (the lease moves
//! to the other worker); members on the list before the flow do not
//! enter; a member who unsubscribes, and one taken off the list, get no
//! further step.

use std::io::Write;
use std::time::Duration;

use crate::util::*;

/// Migrate; marketing templates `welcome` and `tips`.
fn templates(env: &Env) {
    env.ok(&["migrate"]);
    for (name, subject) in [
        ("welcome", "Welcome {{ name }}"),
        ("tips", "Tips for {{ name }}"),
    ] {
        let html = env.dir.path().join(format!("{name}.html"));
        std::fs::write(&html, format!("<p>{name} {{{{ name }}}}</p>\n")).unwrap();
        env.ok(&[
            "template",
            "create",
            name,
            "--subject",
            subject,
            "--from",
            "shop@example.test",
            "--html",
            html.to_str().unwrap(),
            "--stream",
            "marketing",
        ]);
    }
}

/// Import `emails` (name = the local part) into `list`.
fn import(env: &Env, list: &str, file: &str, emails: &[String]) {
    let path = env.dir.path().join(file);
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "email,name").unwrap();
    for e in emails {
        writeln!(f, "{e},{}", e.split('@').next().unwrap()).unwrap();
    }
    drop(f);
    env.ok(&["import", path.to_str().unwrap(), "--list", list]);
}

/// The subjects the peer took for `addr`, in the order it took them.
fn subjects(peer: &ScriptedSmtp, addr: &str) -> Vec<String> {
    peer.messages
        .lock()
        .unwrap()
        .iter()
        .filter(|(rcpts, _)| rcpts.iter().any(|r| r == addr))
        .flat_map(|(_, text)| header(text, "Subject"))
        .collect()
}

/// The pid in the scheduler lease's owner (`host:pid:random`), if held.
fn lease_pid(env: &Env) -> Option<u32> {
    let mut c = env.conn();
    let (owner, _) = mailsplit::store::flows::holder(&mut c).unwrap()?;
    owner?.split(':').nth(1)?.parse().ok()
}

fn flow_ls(env: &Env) -> serde_json::Value {
    serde_json::from_str(env.ok(&["flow", "ls", "--json"]).trim()).unwrap()
}

fn welcome_series(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    )
    .var("MAILSPLIT_LEASE_MS", "3000")
    .var("MAILSPLIT_FLOW_TICK_MS", "200");
    let peer = env.peer();
    templates(&env);
    let old: Vec<String> = (1..=3).map(|i| format!("old{i}@example.test")).collect();
    import(&env, "news", "old.csv", &old);

    // A transactional template is refused as a step, naming the fix.
    let out = env.run(&[
        "flow",
        "create",
        "bad",
        "--list",
        "news",
        "--trigger",
        "join",
        "--step",
        "0:nope",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("template create nope"),
        "{}",
        stderr(&out)
    );

    let said = env.ok(&[
        "flow",
        "create",
        "welcome",
        "--list",
        "news",
        "--trigger",
        "join",
        "--step",
        "0:welcome",
        "--step",
        "6s:tips",
    ]);
    assert!(
        said.contains("3 member(s) already on \"news\" do not enter")
            && said.contains("--include-existing"),
        "{said}"
    );

    // Two workers; one holds the scheduler's lease.
    let mut a = env.worker(&[]);
    let mut b = env.worker(&[]);
    wait_for(30, "a worker to take the flow lease", || {
        lease_pid(&env).is_some()
    });

    let new: Vec<String> = (1..=6).map(|i| format!("new{i}@example.test")).collect();
    import(&env, "news", "new.csv", &new);
    wait_for(30, "step 1 to every new member", || {
        new.iter().all(|e| subjects(peer, e).len() == 1)
    });
    // new5 unsubscribes and new6 is taken off the list before step 2.
    env.sql("UPDATE recipients SET status = 'unsubscribed' WHERE email = 'new5@example.test'");
    env.ok(&["list", "rm", "news", "new6@example.test"]);
    // The lease holder dies between the steps.
    let holder = lease_pid(&env).unwrap();
    let (dead, survivor) = if a.0.id() == holder {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert_eq!(dead.0.id(), holder, "the lease names neither worker");
    signal(&dead.0, "KILL");
    wait_exit(&mut dead.0, 10);
    let survivor_pid = survivor.0.id();
    wait_for(30, "the lease to move to the other worker", || {
        lease_pid(&env) == Some(survivor_pid)
    });
    wait_for(40, "step 2 to the members who stayed", || {
        new[..4].iter().all(|e| subjects(peer, e).len() == 2)
    });
    wait_for(20, "every entry done or left", || {
        let v = flow_ls(&env);
        v["done"] == 4 && v["left"] == 2
    });
    let survivor = if a.0.id() == survivor_pid { a } else { b };
    stop_worker(survivor);

    for (i, e) in new.iter().enumerate() {
        let name = format!("new{}", i + 1);
        let got = subjects(peer, e);
        if i < 4 {
            assert_eq!(
                got,
                vec![format!("Welcome {name}"), format!("Tips for {name}")],
                "{e}"
            );
        } else {
            // The leavers: step 1 only.
            assert_eq!(got, vec![format!("Welcome {name}")], "{e}");
        }
    }
    for e in &old {
        assert!(
            subjects(peer, e).is_empty(),
            "{e} was on the list before the flow"
        );
    }
    // Six step-1 messages and four step-2 ones, nothing else.
    assert_eq!(peer.total(), 6 + 4);
    // The report: entered, each step's messages, leavers by reason.
    let r: serde_json::Value =
        serde_json::from_str(env.ok(&["flow", "report", "welcome", "--json"]).trim()).unwrap();
    assert_eq!(
        (r["entered"].as_i64(), r["done"].as_i64()),
        (Some(6), Some(4)),
        "{r}"
    );
    assert_eq!(r["steps"][0]["sent"], 6, "{r}");
    assert_eq!(r["steps"][1]["sent"], 4, "{r}");
    assert_eq!(r["left"]["unsubscribed"], 1, "{r}");
    assert_eq!(r["left"]["removed"], 1, "{r}");
    // new5 unsubscribed after step 1; new6 was removed, not unsubscribed.
    assert_eq!(r["steps"][0]["unsubscribed"], 1, "{r}");
    assert_eq!(r["steps"][1]["unsubscribed"], 0, "{r}");
    assert!(r["steps"][0]["opened"].is_null(), "{r}");
    // Why each leaver left.
    let mut c = env.conn();
    let flow = mailsplit::store::flows::find(&mut c, "welcome")
        .unwrap()
        .unwrap();
    let mut counts = mailsplit::store::flow_report::entry_counts(&mut c, flow.id).unwrap();
    counts.sort_by(|x, y| x.1.cmp(&y.1));
    let left: Vec<(String, i64)> = counts
        .into_iter()
        .filter_map(|(_, reason, n)| reason.map(|r| (r, n)))
        .collect();
    assert_eq!(
        left,
        vec![("removed".to_string(), 1), ("unsubscribed".to_string(), 1)]
    );
}

/// `--include-existing` enters who is on the list now.
fn include_existing(kind: Kind) {
    let env = World::with_peer(kind, Script::default()).var("MAILSPLIT_FLOW_TICK_MS", "200");
    let peer = env.peer();
    templates(&env);
    let old: Vec<String> = (1..=3).map(|i| format!("old{i}@example.test")).collect();
    import(&env, "news", "old.csv", &old);
    let said = env.ok(&[
        "flow",
        "create",
        "welcome",
        "--list",
        "news",
        "--step",
        "0:welcome",
        "--include-existing",
    ]);
    assert!(said.contains("entered 3 member(s)"), "{said}");
    let w = env.worker(&[]);
    wait_for(30, "step 1 to the existing members", || {
        old.iter().all(|e| peer.count(e) == 1)
    });
    wait_for(20, "every entry done", || flow_ls(&env)["done"] == 3);
    stop_worker(w);
    assert_eq!(peer.total(), 3);
}

/// 300 members join at once: their first step goes as message jobs of up
/// to 100, claimed, marked and recorded a batch at a time. The worker
/// holding a batch is killed with -9 while the relay holds some of its
/// messages (DATA answers slowly): another worker finishes the batch when
/// its claims lapse. Each member is on the wire at most once; each message
/// ends sent, or failed as in doubt (handed to the relay, reply unknown:
/// never sent twice); and every member the relay did not take from the
/// killed worker gets the step.
fn a_batch_survives_its_worker_killed_mid_send(kind: Kind) {
    let script = Script {
        data_delay: Duration::from_millis(150),
        ..Script::default()
    };
    let env = World::with_peer(kind, script)
        .var("MAILSPLIT_FLOW_TICK_MS", "200")
        .var("MAILSPLIT_LEASE_MS", "4000");
    let peer = env.peer();
    templates(&env);
    env.ok(&[
        "flow",
        "create",
        "burst",
        "--list",
        "news",
        "--step",
        "0:welcome",
    ]);
    let members: Vec<String> = (0..300).map(|i| format!("m{i}@example.test")).collect();
    import(&env, "news", "members.csv", &members);
    let mut first = env.worker(&["--concurrency", "10"]);
    wait_for(60, "the first batch on the wire", || peer.total() >= 20);
    signal(&first.0, "KILL");
    let _ = first.0.wait();
    let at_kill = peer.total();
    let second = env.worker(&["--concurrency", "10"]);
    let open = "SELECT status AS a, COALESCE(reply, '') AS b FROM messages";
    wait_for(120, "every step's message to end", || {
        let all = env.text_pairs(open);
        all.len() == members.len() && all.iter().all(|(s, _)| s == "sent" || s == "failed")
    });
    stop_worker(second);
    let ended = env.text_pairs(open);
    let failed: Vec<&(String, String)> = ended.iter().filter(|(s, _)| s == "failed").collect();
    assert!(
        failed
            .iter()
            .all(|(_, why)| why.contains("never sent twice")),
        "a failure other than in doubt: {failed:?}"
    );
    eprintln!(
        "relay took {at_kill} before the kill, {} in all; {} failed in doubt",
        peer.total(),
        failed.len()
    );
    assert_eq!(peer.duplicates(), 0, "a member got the step twice");
    // Only what was at the relay when the worker died may be failed.
    assert!(
        failed.len() <= 10,
        "{} failed in doubt, 10 sessions",
        failed.len()
    );
    let sent = ended.iter().filter(|(s, _)| s == "sent").count();
    assert_eq!(sent + failed.len(), members.len());
    assert!(
        peer.total() as usize >= sent,
        "sent {sent}, relay took {}",
        peer.total()
    );
    assert!(
        at_kill < members.len() as u32 && sent > at_kill as usize,
        "the kill came after the batch: nothing to finish ({at_kill} at the kill)"
    );
}

both!(
    welcome_series,
    include_existing,
    a_batch_survives_its_worker_killed_mid_send
);
