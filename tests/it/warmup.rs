//! Warm-up (`rate warmup`): a group's budget per day, counted in the
//! database across every worker, grows by the factor each day up to the
//! final rate; mail past a day's budget waits for the next day (deferred,
//! never failed). Checked at the SMTP peer with days of two seconds, and
//! at the store with workers racing for the last tokens of a day.

use std::time::{Duration, Instant};

use mailsplit::store::rates::Lease;
use mailsplit::store::warmups;

use crate::util::*;

/// A worker whose log goes to a file in the test's directory.
fn logged_worker(env: &Env, name: &str) -> Proc {
    let log = std::fs::File::create(env.dir.path().join(format!("{name}.log"))).unwrap();
    Proc(
        env.cmd(&["worker", "--smtp", &env.smtp, "--concurrency", "20"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The group's schedule as stored.
fn schedule_of(env: &Env, group: &str) -> warmups::Warmup {
    warmups::list(&mut env.conn())
        .unwrap()
        .into_iter()
        .find(|w| w.name == group)
        .unwrap_or_else(|| panic!("no warm-up stored for {group}"))
}

/// Accepts per warm-up day (`every` long from `day0`), for `days` days.
fn per_day(times: &[Instant], day0: Instant, every: Duration, days: u32) -> Vec<usize> {
    (0..days)
        .map(|k| {
            let start = day0 + every * k;
            times
                .iter()
                .filter(|&&t| t >= start && t < start + every)
                .count()
        })
        .collect()
}

/// 10/s ×2 every 6 s up to 40/s: days of 60, 120, 240, then 240 each.
/// The days are longer than a day's budget takes at the group's pace
/// (240 at 200/s: 1.2 s) plus the most a deferred job comes back after
/// the day begins (its backlog estimate, capped at 4 s, less the 1 s it
/// comes early): with 3 s days a job deferred late in one day came back
/// too late to fill the next.
/// Two workers, a group paced at 200/s within a day (so a day's budget
/// goes out in its first part and the budget, not the pace, shapes the
/// days). Without a budget shared in the database, two workers would send
/// twice the schedule; a pace instead of a budget would send 570 a day.
/// The workers are up before `rate warmup` begins day 0; the days are
/// judged from the first whole day after their first message (day 0 holds
/// the enqueue); then the warm-up is turned off and the rest goes at once.
fn two_workers_follow_a_warm_up_schedule(kind: Kind) {
    let _alone = crate::util::alone();
    let env = World::with_peer(kind, Script::default());
    let n = 1_200;
    env.campaign_without_enqueue("warm", n);
    let relay = format!("relay:127.0.0.1:{}", env.peer().port);
    env.ok(&["rate", "set", &relay, "200/s", "--burst", "5"]);
    // The workers are up and idle before day 0 begins.
    let _w: Vec<Proc> = (0..2)
        .map(|i| logged_worker(&env, &format!("w{i}")))
        .collect();
    wait_for(60, "two workers' heartbeats", || env.workers().len() == 2);
    let said = env.ok(&[
        "rate", "warmup", &relay, "--start", "10/s", "--factor", "2", "--every", "6s", "--until",
        "40/s",
    ]);
    assert!(said.contains("10/s ×2 every 6s up to 40/s"), "{said}");
    let w = schedule_of(&env, &relay);
    let every = Duration::from_millis(w.every_ms as u64);
    // The peer's clock is Instant: day 0 began this long before now.
    let day0 =
        Instant::now() - Duration::from_millis((mailsplit::store::now_ms() - w.since_ms) as u64);
    env.ok(&["enqueue", "warm"]);
    // 1200 do not fit in day 0's 60, and status says why the ETA is days
    // away.
    let status = env.status("warm");
    let note = status["eta_note"].as_str().unwrap_or_default().to_string();
    assert!(note.contains(&format!("warm-up of {relay}")), "{status}");
    assert!(status["eta_seconds"].as_u64().unwrap_or(0) >= 6, "{status}");
    wait_for(60, "the first message", || env.peer().total() > 0);
    let first = env.peer().log.lock().unwrap()[0].0;
    // Day 0 holds the enqueue: judged from the next whole day.
    let judged = (first.duration_since(day0).as_millis() / every.as_millis()) as u32 + 1;
    let listed = env.ok(&["rate", "list"]);
    assert!(listed.contains("warm-up day "), "{listed}");
    assert!(listed.contains("allowed today"), "{listed}");
    // Four whole days after the first message's.
    std::thread::sleep((day0 + every * (judged + 4)).saturating_duration_since(Instant::now()));
    let mut times: Vec<Instant> = env
        .peer()
        .log
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| *t)
        .collect();
    times.sort();
    let days = per_day(&times, day0, every, judged + 4);
    let allowed: Vec<usize> = (0..judged + 4)
        .map(|k| w.allowance(i64::from(k)) as usize)
        .collect();
    eprintln!("accepted per 6 s warm-up day: {days:?}, allowed {allowed:?}");
    for k in 0..(judged + 4) as usize {
        let (got, want) = (days[k], allowed[k]);
        assert!(
            got <= want + want / 10,
            "day {k} over its allowance: {days:?} {allowed:?}"
        );
        if k >= judged as usize {
            assert!(
                got.abs_diff(want) * 10 <= want,
                "day {k}: {got} accepted, the schedule allows {want}: {days:?}\n{}",
                logs(&env)
            );
        }
    }
    // Ended: the rest goes at the group's rate, each recipient once, none
    // failed (a day's end deferred them, never failed them).
    env.ok(&["rate", "warmup", &relay, "--off"]);
    let listed = env.ok(&["rate", "list"]);
    assert!(!listed.contains("warm-up day"), "{listed}");
    wait_done(&env, "warm", 60);
    assert_eq!(env.peer().total() as usize, n, "every recipient once");
    assert_eq!(env.peer().duplicates(), 0);
    let status = env.status("warm");
    assert_eq!(status["failed"], 0, "{status}");
    assert_eq!(status["sent"], n as i64, "{status}");
}

/// The workers' logs, for a failing assertion.
fn logs(env: &Env) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(env.dir.path()).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {}\n", p.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// Four threads (as four workers) race for one day's budget of 100 over
/// the database, each asking for 7 at a time: exactly 100 are granted,
/// never 101, and what the GCRA does not grant goes back to the budget.
fn racing_leases_never_pass_a_days_budget(kind: Kind) {
    let env = World::new(kind);
    env.ok(&["migrate"]);
    env.ok(&[
        "rate",
        "set",
        "domain:warm.test",
        "100000/s",
        "--burst",
        "100000",
    ]);
    env.ok(&[
        "rate",
        "warmup",
        "domain:warm.test",
        "--start",
        "100/d",
        "--factor",
        "2",
        "--until",
        "1000/d",
    ]);
    let granted: Vec<u32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut conn = env.conn();
                    let mut mine = 0;
                    for _ in 0..40 {
                        let now_us = mailsplit::store::now_ms() * 1000;
                        match warmups::lease(&mut conn, "domain:warm.test", 7, now_us, 50_000)
                            .unwrap()
                        {
                            Lease::Granted { count, .. } => mine += count,
                            // Spent (a day's wait), or a lost race.
                            Lease::Wait(_) => {}
                            Lease::NoGroup => panic!("the group is there"),
                        }
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(granted.iter().sum::<u32>(), 100, "{granted:?}");
    let w = schedule_of(&env, "domain:warm.test");
    assert_eq!((w.period, w.used), (0, 100));
    // A group whose GCRA grants nothing now (1/h, its token spent) takes
    // nothing from the budget either.
    env.ok(&["rate", "set", "domain:slow.test", "1/h", "--burst", "1"]);
    env.ok(&[
        "rate",
        "warmup",
        "domain:slow.test",
        "--start",
        "10/d",
        "--until",
        "10/d",
    ]);
    let mut conn = env.conn();
    let now_us = mailsplit::store::now_ms() * 1000;
    let first = warmups::lease(&mut conn, "domain:slow.test", 1, now_us, 0).unwrap();
    assert!(
        matches!(first, Lease::Granted { count: 1, .. }),
        "{first:?}"
    );
    let second = warmups::lease(&mut conn, "domain:slow.test", 1, now_us, 0).unwrap();
    assert!(matches!(second, Lease::Wait(_)), "{second:?}");
    assert_eq!(schedule_of(&env, "domain:slow.test").used, 1);
    // `--off`: the budget no longer applies (the GCRA alone answers).
    env.ok(&["rate", "warmup", "domain:warm.test", "--off"]);
    let now_us = mailsplit::store::now_ms() * 1000;
    let free = warmups::lease(&mut conn, "domain:warm.test", 7, now_us, 50_000).unwrap();
    assert!(matches!(free, Lease::Granted { count: 7, .. }), "{free:?}");
}

/// What `rate warmup` refuses names the fix; `rate list` shows the day,
/// its allowance and the schedule; `rate delete` ends the warm-up too.
fn warmup_commands_check_and_show(kind: Kind) {
    let env = World::new(kind);
    env.ok(&["migrate"]);
    for (args, says) in [
        (
            vec!["--start", "200/d", "--until", "100/d"],
            "slower than --start",
        ),
        (
            vec!["--start", "200/d", "--until", "1000/d", "--factor", "0.5"],
            "--factor",
        ),
        (
            vec!["--start", "200/d", "--until", "1000/d", "--every", "0.5s"],
            "--every",
        ),
        (vec!["--start", "200/w", "--until", "1000/d"], "bad rate"),
        (vec!["--start", "200/d"], "--until"),
    ] {
        let mut all = vec!["rate", "warmup", "domain:gmail.com"];
        all.extend(args.iter());
        let out = env.run(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{all:?}: {}", stderr(&out));
    }
    let out = env.run(&[
        "rate",
        "warmup",
        "campaign:nope",
        "--start",
        "1/s",
        "--until",
        "2/s",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = env.run(&["rate", "warmup", "domain:gmail.com", "--off"]);
    assert!(stderr(&out).contains("has no warm-up"), "{}", stderr(&out));
    env.ok(&[
        "rate",
        "warmup",
        "domain:gmail.com",
        "--start",
        "200/d",
        "--factor",
        "1.5",
        "--until",
        "100000/d",
    ]);
    let listed = env.ok(&["rate", "list"]);
    // A new group paces at the final rate within a day.
    assert!(listed.contains("domain:gmail.com"), "{listed}");
    assert!(listed.contains("100000/d"), "{listed}");
    assert!(
        listed.contains("warm-up day 0 (of 16 to the full rate): 200 allowed today, 0 used"),
        "{listed}"
    );
    env.ok(&["rate", "delete", "domain:gmail.com"]);
    assert!(schedule_none(&env));
}

fn schedule_none(env: &Env) -> bool {
    warmups::list(&mut env.conn()).unwrap().is_empty()
}

both!(
    two_workers_follow_a_warm_up_schedule,
    racing_leases_never_pass_a_days_budget,
    warmup_commands_check_and_show,
);
