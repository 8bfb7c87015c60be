//! Failed logins, and who the client is.
//!
//! A wrong admin token (bearer header or login form) or webhook token is
//! counted twice: against the client's address and against the first
//! characters of what it sent. Once either has [`MAX_FAILURES`] within
//! [`WINDOW`], wrong tokens from that client (or starting that way) get 429
//! for the rest of the window instead of 401. A request with the right
//! token, or an open session, is always let in: a lockout that refused it
//! would let anyone who shares the operator's address (everyone, behind a
//! reverse proxy) lock the operator out with ten bad guesses. Guessing
//! stays hopeless without the lockout's help: an exposed listener's token
//! is long and random (`config::token_policy`); what the 429 adds is a
//! clear signal, in the answer and the log. Every failure is logged with
//! the client's address, never with what it sent.
//!
//! The client is the peer of the connection, unless the peer is one of the
//! `--trusted-proxy` addresses: then it is the right-most address of
//! `X-Forwarded-For` that is not a trusted proxy (each proxy appends the
//! address it got the request from, so entries left of it may be forged
//! by the client). A peer that is not trusted cannot name another client.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::config::TrustedProxy;

/// Failures allowed per client, and per token prefix, within [`WINDOW`].
pub const MAX_FAILURES: u32 = 10;
/// The window failures are counted in.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Clients and prefixes remembered at most (a flood from many addresses
/// forgets the oldest windows first).
const MAX_KEYS: usize = 10_000;
/// Characters of a wrong token that make its prefix: enough to tell one
/// script's stale token from another's, too few to matter if it leaked.
const PREFIX_CHARS: usize = 4;

/// Which token a request got wrong: prefixes are counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// `MAILSPLIT_ADMIN_TOKEN`, by bearer header or login form.
    Admin,
    /// `MAILSPLIT_WEBHOOK_TOKEN`.
    Webhook,
}

/// What a failure is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Client(IpAddr),
    /// A hash of the credential's kind and the first characters of the
    /// wrong token: nothing of it is kept as sent.
    Prefix([u8; 16]),
}

fn prefix_key(kind: Credential, token: &str) -> Key {
    let head: String = token.chars().take(PREFIX_CHARS).collect();
    let digest = Sha256::new()
        .chain_update([kind as u8])
        .chain_update(b"\0")
        .chain_update(head.as_bytes())
        .finalize();
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    Key::Prefix(key)
}

/// Failed attempts per client address and per token prefix.
#[derive(Debug, Default)]
pub struct Failures {
    by_key: Mutex<HashMap<Key, (Instant, u32)>>,
}

impl Failures {
    fn left(map: &HashMap<Key, (Instant, u32)>, key: &Key) -> Option<Duration> {
        let &(since, count) = map.get(key)?;
        let left = WINDOW.checked_sub(since.elapsed())?;
        (count >= MAX_FAILURES).then_some(left)
    }

    /// How long a wrong `token` of `kind` from `client` is answered 429,
    /// if its client or its prefix used up its failures.
    pub fn blocked(&self, client: IpAddr, kind: Credential, token: &str) -> Option<Duration> {
        let map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let by_client = Self::left(&map, &Key::Client(client));
        let by_prefix = Self::left(&map, &prefix_key(kind, token));
        by_client.max(by_prefix)
    }

    /// Whether `client` used up its failures (for requests that sent no
    /// token at all).
    pub fn client_blocked(&self, client: IpAddr) -> Option<Duration> {
        let map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        Self::left(&map, &Key::Client(client))
    }

    /// Count one wrong `token` of `kind` from `client`; logs it (`what`:
    /// how it was sent; with the client, never the token).
    pub fn failed(&self, client: IpAddr, kind: Credential, what: &str, token: &str) {
        let now = Instant::now();
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_KEYS - 1 {
            map.retain(|_, (since, _)| since.elapsed() < WINDOW);
        }
        let mut count = 0;
        for key in [Key::Client(client), prefix_key(kind, token)] {
            if map.len() >= MAX_KEYS && !map.contains_key(&key) {
                continue;
            }
            let entry = map.entry(key).or_insert((now, 0));
            if entry.0.elapsed() >= WINDOW {
                *entry = (now, 0);
            }
            entry.1 += 1;
            if key == Key::Client(client) {
                count = entry.1;
            }
        }
        tracing::warn!(client = %client, failures = count, "{what}: wrong token");
    }
}

/// The client of a request as [`client_of`] finds it, for handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client(pub IpAddr);

impl FromRequestParts<super::State> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &super::State,
    ) -> Result<Client, Self::Rejection> {
        Ok(Client(client_of(
            &parts.extensions,
            &parts.headers,
            &state.settings.trusted_proxies,
        )))
    }
}

/// The request's client: the connection's peer (`0.0.0.0` if the
/// listener gave none), or, when the peer is a trusted proxy, the
/// right-most `X-Forwarded-For` address that is not one.
pub fn client_of(
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    trusted: &[TrustedProxy],
) -> IpAddr {
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_canonical())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let is_trusted = |ip: IpAddr| trusted.iter().any(|t| t.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    // Several headers count as one list, in order.
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        match parse_hop(hop) {
            Some(ip) if is_trusted(ip) => client = ip,
            Some(ip) => return ip,
            // Garbage where an address should be: the nearest proxy that
            // handed it on is all that is known.
            None => return client,
        }
    }
    client
}

/// One `X-Forwarded-For` entry: `192.0.2.1`, `2001:db8::1`,
/// `[2001:db8::1]:443`, `192.0.2.1:443`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    hop.parse::<SocketAddr>()
        .ok()
        .map(|s| s.ip().to_canonical())
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
    use axum::http::HeaderValue;

    #[test]
    fn ten_failures_block_that_client_and_that_prefix_only() {
        let f = Failures::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let admin = Credential::Admin;
        for i in 0..MAX_FAILURES - 1 {
            f.failed(a, admin, "test", &format!("guess{i}"));
        }
        assert_eq!(f.blocked(a, admin, "other"), None);
        f.failed(a, admin, "test", "guess9");
        assert!(f.blocked(a, admin, "other").is_some());
        assert!(f.client_blocked(a).is_some());
        // "gues…" failed ten times, from any address: that prefix is blocked.
        assert!(f.blocked(b, admin, "guess-from-b").is_some());
        assert_eq!(f.blocked(b, admin, "something else"), None);
        assert_eq!(f.blocked(b, Credential::Webhook, "guess"), None);
        assert_eq!(f.client_blocked(b), None);
    }

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn from(peer: &str) -> axum::http::Extensions {
        let mut e = axum::http::Extensions::new();
        e.insert(ConnectInfo(SocketAddr::new(peer.parse().unwrap(), 5000)));
        e
    }

    #[test]
    fn forwarded_for_is_read_only_from_trusted_proxies() {
        let trusted = [
            TrustedProxy::parse("10.0.0.1").unwrap(),
            TrustedProxy::parse("10.1.0.0/16").unwrap(),
        ];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let xff = headers(&["198.51.100.7, 203.0.113.5"]);
        // Not a trusted peer: the header is ignored.
        assert_eq!(
            client_of(&from("192.0.2.9"), &xff, &trusted),
            ip("192.0.2.9")
        );
        // Trusted: the right-most address that is no proxy of ours.
        assert_eq!(
            client_of(&from("10.0.0.1"), &xff, &trusted),
            ip("203.0.113.5")
        );
        let chain = headers(&["198.51.100.7", "203.0.113.5, 10.1.2.3"]);
        assert_eq!(
            client_of(&from("::ffff:10.0.0.1"), &chain, &trusted),
            ip("203.0.113.5")
        );
        // No header, or only proxies: the nearest one.
        assert_eq!(
            client_of(&from("10.0.0.1"), &headers(&[]), &trusted),
            ip("10.0.0.1")
        );
        assert_eq!(
            client_of(&from("10.0.0.1"), &headers(&["10.1.9.9"]), &trusted),
            ip("10.1.9.9")
        );
        // Garbage is no address: the proxy that passed it on.
        assert_eq!(
            client_of(
                &from("10.0.0.1"),
                &headers(&["203.0.113.5, unknown"]),
                &trusted
            ),
            ip("10.0.0.1")
        );
        assert_eq!(
            client_of(
                &from("10.0.0.1"),
                &headers(&["[2001:db8::1]:443"]),
                &trusted
            ),
            ip("2001:db8::1")
        );
        // Nothing trusted: never read.
        assert_eq!(client_of(&from("10.0.0.1"), &xff, &[]), ip("10.0.0.1"));
    }
}
