//! The ETA after a resume: computed from the rate of recent sending, never
//! from a window that holds the pause. A campaign limited to 25/s is
//! paused for three rate windows, by `pause` and by hand in SQL; at the
//! first outcome after each resume a formula that read (messages of the
//! last window) / (window + pause) would give a quarter of the rate before
//! the pause or less, and an ETA four times too long. The rate window is
//! shortened through `MAILSPLIT_RATE_WINDOW_MS` (production: 5 s, here
//! 2 s), so a pause takes 6 s, not 15; the proportions, which are what the
//! test checks, stay the same.

use std::time::Duration;

use crate::util::*;

const RATE: f64 = 25.0;
/// The rate window the processes of this test use: two fifths of
/// production's, still 50 messages long at 25/s (a shorter one reads the
/// worker's batches of outcomes as noise on a loaded machine).
const WINDOW_MS: u64 = 2_000;

fn eta_after_a_resume_comes_from_recent_sending(kind: Kind) {
    let _alone = crate::util::alone();
    let env = World::with_peer(kind, Script::default())
        .var("MAILSPLIT_RATE_WINDOW_MS", &WINDOW_MS.to_string());
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
        // The pause: three windows, longer than the idle gap (two), so a
        // window holding it would read a rate far below the real one.
        std::thread::sleep(Duration::from_millis(3 * WINDOW_MS));
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

both!(eta_after_a_resume_comes_from_recent_sending,);
