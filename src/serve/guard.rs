//! Failed logins per client address: after [`MAX_FAILURES`] wrong admin
//! tokens (bearer header or login form) or webhook tokens within
//! [`WINDOW`], a client gets 429 for the rest of the window, whatever it
//! sends, so guessing a token takes ten tries a minute. Every failure is
//! logged with the client's address, never with what it sent.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::{header, Extensions, StatusCode};
use axum::response::{IntoResponse, Response};

/// Failures allowed per client within [`WINDOW`].
pub const MAX_FAILURES: u32 = 10;
/// The window failures are counted in.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Clients remembered at most (a flood from many addresses forgets the
/// oldest windows first).
const MAX_CLIENTS: usize = 10_000;

/// Failed attempts per client address.
#[derive(Debug, Default)]
pub struct Failures {
    by_client: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Failures {
    /// How long `client` must still wait, if it used up its failures.
    pub fn blocked(&self, client: IpAddr) -> Option<Duration> {
        let map = self.by_client.lock().unwrap_or_else(|p| p.into_inner());
        let &(since, count) = map.get(&client)?;
        let left = WINDOW.checked_sub(since.elapsed())?;
        (count >= MAX_FAILURES).then_some(left)
    }

    /// Count one failure of `client`; logs it (`what`: which credential).
    pub fn failed(&self, client: IpAddr, what: &str) {
        let now = Instant::now();
        let mut map = self.by_client.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_CLIENTS {
            map.retain(|_, (since, _)| since.elapsed() < WINDOW);
        }
        if map.len() >= MAX_CLIENTS {
            return;
        }
        let entry = map.entry(client).or_insert((now, 0));
        if entry.0.elapsed() >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
        tracing::warn!(client = %client, failures = entry.1, "{what}: wrong token");
    }
}

/// The address of the client that opened the connection (the listener is
/// served with connect info; `0.0.0.0` if not).
pub fn client(extensions: &Extensions) -> IpAddr {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// 429 with `Retry-After`, logged.
pub fn too_many(client: IpAddr, what: &str, wait: Duration) -> Response {
    tracing::warn!(client = %client, "{what}: refused, too many failed attempts");
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, (wait.as_secs() + 1).to_string())],
        "too many failed attempts: wait a minute\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_failures_block_that_client_only() {
        let f = Failures::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..MAX_FAILURES - 1 {
            f.failed(a, "test");
        }
        assert_eq!(f.blocked(a), None);
        f.failed(a, "test");
        assert!(f.blocked(a).is_some());
        assert_eq!(f.blocked(b), None);
    }
}
