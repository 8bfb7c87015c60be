//! A child's stderr read line by line on a thread of its own, so a test can
//! wait for a line (an event the program logs) instead of sleeping; and a
//! piped stderr that never blocks its writer however late the test reads it.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr};
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

/// Put an unbounded buffer between a child's piped stderr and whoever
/// reads `child.stderr`: a thread drains the child's pipe as it writes, so
/// a test that reads the log only after the child is killed (or never)
/// cannot stall it. A worker blocked on a full 64 KiB pipe stops sending
/// in the middle of a campaign: a throttled relay logs a line per
/// deferred recipient, and a test waiting for the campaign to finish then
/// times out for a reason that is not the program's.
pub fn unblock(child: &mut Child) {
    let Some(mut from) = child.stderr.take() else {
        return;
    };
    let (reader, mut writer) = std::io::pipe().expect("a pipe for the child's stderr");
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    // Only this thread waits on the test: it blocks, the child does not.
    std::thread::spawn(move || {
        for chunk in rx {
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    child.stderr = Some(ChildStderr::from(std::os::fd::OwnedFd::from(reader)));
}
