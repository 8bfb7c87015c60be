//! A relay's sending quota, as Amazon SES keeps one: at most `per_second`
//! MAIL commands accepted in any second (a sliding window over every
//! session of the peer); beyond it MAIL gets `454 4.7.0 Throttling
//! failure: Maximum sending rate exceeded`, and the RCPT and DATA of that
//! transaction `503 5.5.1 Error: need MAIL command`, as Postfix-like
//! relays answer commands pipelined behind a refused MAIL.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const THROTTLE_REPLY: &[u8] =
    b"454 4.7.0 Throttling failure: Maximum sending rate exceeded\r\n";
pub const NEED_MAIL_REPLY: &[u8] = b"503 5.5.1 Error: need MAIL command\r\n";

/// Shared by the test and every session of the peer.
pub struct MailQuota {
    pub per_second: usize,
    accepted: Mutex<VecDeque<Instant>>,
    /// Every MAIL, when and whether it was throttled.
    pub attempts: Mutex<Vec<(Instant, bool)>>,
}

impl MailQuota {
    pub fn new(per_second: usize) -> MailQuota {
        MailQuota {
            per_second,
            accepted: Mutex::new(VecDeque::new()),
            attempts: Mutex::new(Vec::new()),
        }
    }

    /// A MAIL arrives now: true when the quota allows it.
    pub fn admit(&self) -> bool {
        let now = Instant::now();
        let mut accepted = self.accepted.lock().unwrap();
        while accepted
            .front()
            .is_some_and(|&t| now.duration_since(t) >= Duration::from_secs(1))
        {
            accepted.pop_front();
        }
        let ok = accepted.len() < self.per_second;
        if ok {
            accepted.push_back(now);
        }
        self.attempts.lock().unwrap().push((now, !ok));
        ok
    }

    /// MAIL commands since `from`: in all, and throttled.
    pub fn attempts_since(&self, from: Instant) -> (usize, usize) {
        let a = self.attempts.lock().unwrap();
        let recent = a.iter().filter(|(t, _)| *t >= from);
        let (all, throttled) = recent.fold((0, 0), |(n, k), (_, th)| (n + 1, k + usize::from(*th)));
        (all, throttled)
    }
}
