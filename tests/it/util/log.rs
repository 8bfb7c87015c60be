//! A child's stderr read line by line on a thread of its own, so a test can
//! wait for a line (an event the program logs) instead of sleeping.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The lines a child wrote on stderr so far (and still writes).
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    /// Take the child's piped stderr and collect it until the child exits.
    pub fn follow(child: &mut Child) -> Log {
        let log = Log::default();
        let stderr = child.stderr.take().expect("stderr is not piped");
        let lines = Arc::clone(&log.0);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        log
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
    }

    /// Wait up to `secs` for a line containing `needle`; returns it.
    pub fn wait_line(&self, secs: u64, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(line) = self
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {needle:?} after {secs} s; the log:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
