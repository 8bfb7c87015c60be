//! The ETA after a resume (issue 26 item 5): computed from the rate of
//! recent sending, never from a window that holds the pause. A campaign
//! limited to 25/s is paused for 15 s, by `pause` and by hand in SQL; at
//! the first outcome after each resume the old formula read about
//! (messages of the last window) / (window + pause): a quarter of the
//! rate before the pause or less, and an ETA four times too long.

use std::time::Duration;

use crate::util::*;

#[test]
fn eta_after_a_resume_comes_from_recent_sending_sqlite() {
    eta_after_a_resume_comes_from_recent_sending(Kind::Sqlite)
}

#[test]
fn eta_after_a_resume_comes_from_recent_sending_postgres() {
    eta_after_a_resume_comes_from_recent_sending(Kind::Postgres)
}

const RATE: f64 = 25.0;

fn eta_after_a_resume_comes_from_recent_sending(kind: Kind) {
    let _alone = crate::util::alone();
    let (_tmp, _bs, _peer, env) = setup(kind, Script::default());
    env.campaign_without_enqueue("eta", 1500);
    env.ok(&["rate", "set", "campaign:eta", "25/s", "--burst", "5"]);
    env.ok(&["enqueue", "eta"]);
    let _w = env.worker(&[]);
    let mut sent = 0;
    for how in ["command", "sql"] {
        sent += 150;
        let mut running = 0.0;
        wait_for(60, "sending under way", || {
            let status = env.status("eta");
            running = status["rate"].as_f64().unwrap();
            status["sent"].as_i64().unwrap() >= sent && running > 0.0
        });
        match how {
            "command" => drop(env.ok(&["pause", "eta"])),
            _ => env.sql("UPDATE campaigns SET paused = TRUE WHERE name = 'eta'"),
        }
        // The pause: long enough that a window holding it reads a rate
        // far below the real one.
        std::thread::sleep(Duration::from_secs(15));
        let before = env.status("eta")["sent"].as_i64().unwrap();
        match how {
            "command" => drop(env.ok(&["resume", "eta"])),
            _ => env.sql("UPDATE campaigns SET paused = FALSE WHERE name = 'eta'"),
        }
        let mut status = env.status("eta");
        wait_for(60, "the first outcome after the resume", || {
            status = env.status("eta");
            status["sent"].as_i64().unwrap() > before && status["eta_seconds"].is_u64()
        });
        let pending = status["pending"].as_f64().unwrap();
        let eta = status["eta_seconds"].as_f64().unwrap();
        let rate = status["rate"].as_f64().unwrap();
        // At most 25/s, as fast as this machine goes (the rate just
        // before the pause): anything above half of that is a rate of
        // sending, not of sending and waiting.
        assert!(
            rate > running / 2.0 && rate <= 2.0 * RATE,
            "{how}: rate {rate} after the resume, {running} before the pause: {status}"
        );
        assert!(
            eta <= 2.0 * pending / running + 1.0,
            "{how}: ETA {eta} s for {pending} pending at {running}/s: {status}"
        );
        sent = status["sent"].as_i64().unwrap();
    }
}
