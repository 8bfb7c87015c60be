//! Signed event webhooks out: `webhook add | ls | rm`, and the
//! delivery of the outbox ([`crate::store::outbox`]) to each receiver.
//!
//! Facts are written into the outbox in the transaction that records them
//! (the worker's outcomes, the bounce stage's reports, `serve`'s one-click
//! unsubscribe, a campaign seen done). [`deliver::run`] (in every worker and
//! in `serve`) takes a lease on one webhook at a time, POSTs its oldest
//! events in batches of [`BATCH`], signed ([`sign`]), deletes them once the
//! receiver answered 2xx, and otherwise tries again later with a doubling
//! delay: at least once, in the order written, given up after
//! `give_up` of
//! [`Delivery`].

pub mod address;
pub mod deliver;
mod http;

use std::time::Duration;

use hmac::{Hmac, Mac};

pub use crate::config::WebhookDelivery as Delivery;
use sha2::Sha256;

use crate::store::outbox::EventKind;
use crate::store::webhooks::{self as store, Webhook};
use crate::store::{Conn, StoreError};

/// Events per POST at most.
pub const BATCH: i64 = 500;
/// Retry delays stop doubling here.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(600);
/// Bound on one POST: connecting, TLS, sending and the receiver's answer.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Mailsplit-Signature";
/// Longest secret accepted (a secret is a password, not a document).
const MAX_SECRET: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook URL {0:?} is not an http:// or https:// URL with a host")]
    BadUrl(String),
    /// `url` is already redacted.
    #[error("webhook URL {url:?} points at {addr}, a {kind} address (this machine or its link, not a receiver elsewhere); if the receiver runs here on purpose, add --allow-local")]
    LocalAddress {
        url: String,
        kind: &'static str,
        addr: String,
    },
    #[error("unknown webhook event {0:?}; events: {list}", list = event_names())]
    UnknownEvent(String),
    #[error("--events is empty; events: {}", event_names())]
    NoEvents,
    #[error("--secret must be 1 to {MAX_SECRET} characters without spaces or control characters")]
    BadSecret,
    #[error("no webhook {0}; `mailsplit webhook ls` lists them")]
    UnknownWebhook(i64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl WebhookError {
    pub fn is_usage(&self) -> bool {
        match self {
            WebhookError::Store(e) => e.is_usage(),
            _ => true,
        }
    }
}

fn event_names() -> String {
    EventKind::ALL
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `webhook add` stored.
#[derive(Debug)]
pub struct Added {
    pub id: i64,
    pub events: Vec<EventKind>,
    /// The secret, when mailsplit made it (shown once, never again).
    pub generated_secret: Option<String>,
}

/// Check and store a webhook; a secret is generated when none is given.
/// Unless `allow_local`, a URL whose host is or resolves to a local
/// address ([`address`]) is refused.
pub fn add(
    conn: &mut Conn,
    url: &str,
    events: &str,
    secret: Option<&str>,
    allow_local: bool,
) -> Result<Added, WebhookError> {
    let url = check_url(url)?;
    if !allow_local {
        check_not_local(&url)?;
    }
    let events = parse_events(events)?;
    let (secret, generated) = match secret {
        Some(s) if valid_secret(s) => (s.to_string(), false),
        Some(_) => return Err(WebhookError::BadSecret),
        None => (new_secret(), true),
    };
    let id = store::add(conn, &url, &events, &secret, allow_local)?;
    Ok(Added {
        id,
        events,
        generated_secret: generated.then_some(secret),
    })
}

/// Every webhook with its counts and the events waiting for it.
pub fn list(conn: &mut Conn) -> Result<Vec<(Webhook, i64)>, WebhookError> {
    Ok(store::list(conn)?)
}

/// Remove a webhook: nothing more is delivered to it.
pub fn remove(conn: &mut Conn, id: i64) -> Result<(), WebhookError> {
    match store::remove(conn, id)? {
        true => Ok(()),
        false => Err(WebhookError::UnknownWebhook(id)),
    }
}

/// An http(s) URL with a host, as stored.
fn check_url(raw: &str) -> Result<String, WebhookError> {
    let bad = || WebhookError::BadUrl(crate::redact::url(raw));
    let url = url::Url::parse(raw.trim()).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad());
    }
    Ok(url.to_string())
}

/// Refuse a URL (already checked by [`check_url`]) whose host is a local
/// address, a name for this machine, or a name that resolves to a local
/// address now. A name that does not resolve yet is taken: the deliverer
/// checks what it resolves to at every delivery.
fn check_not_local(raw: &str) -> Result<(), WebhookError> {
    let refuse = |kind, addr: String| WebhookError::LocalAddress {
        url: crate::redact::url(raw),
        kind,
        addr,
    };
    let url = url::Url::parse(raw).map_err(|_| WebhookError::BadUrl(crate::redact::url(raw)))?;
    let port = url.port_or_known_default().unwrap_or(80);
    match url.host() {
        Some(url::Host::Ipv4(ip)) => match address::local_kind(ip.into()) {
            Some(kind) => Err(refuse(kind, ip.to_string())),
            None => Ok(()),
        },
        Some(url::Host::Ipv6(ip)) => match address::local_kind(ip.into()) {
            Some(kind) => Err(refuse(kind, ip.to_string())),
            None => Ok(()),
        },
        Some(url::Host::Domain(name)) if address::is_localhost_name(name) => {
            Err(refuse("loopback", name.to_string()))
        }
        Some(url::Host::Domain(name)) => {
            let resolved = std::net::ToSocketAddrs::to_socket_addrs(&(name, port));
            for addr in resolved.into_iter().flatten() {
                if let Some(kind) = address::local_kind(addr.ip()) {
                    return Err(refuse(kind, format!("{} ({name})", addr.ip())));
                }
            }
            Ok(())
        }
        None => Err(WebhookError::BadUrl(crate::redact::url(raw))),
    }
}

/// `sent,failed`: each a known kind, no repeats, at least one.
fn parse_events(text: &str) -> Result<Vec<EventKind>, WebhookError> {
    let mut kinds = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let kind: EventKind = name
            .parse()
            .map_err(|_| WebhookError::UnknownEvent(name.to_string()))?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    if kinds.is_empty() {
        return Err(WebhookError::NoEvents);
    }
    Ok(kinds)
}

fn valid_secret(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SECRET
        && !s.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// 32 random bytes, hex: 256 bits for HMAC-SHA256.
fn new_secret() -> String {
    data_encoding::HEXLOWER.encode(&rand::random::<[u8; 32]>())
}

/// The `Mailsplit-Signature` value of `body` sent at `t` (Unix seconds):
/// `t=T,v1=HEX(HMAC-SHA256(secret, "T.body"))`.
pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        // HMAC takes a key of any length; this arm is never taken.
        Err(_) => return format!("t={t},v1="),
    };
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let v1 = data_encoding::HEXLOWER.encode(&mac.finalize().into_bytes());
    format!("t={t},v1={v1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_http() {
        assert!(check_url("https://hooks.example/x?y=1").is_ok());
        assert!(check_url("http://127.0.0.1:9/").is_ok());
        for bad in [
            "ftp://x/",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "x",
            "http://",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn local_hosts_are_refused_in_every_spelling() {
        for raw in [
            "http://127.0.0.1:9/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://127.1/",
            "http://0177.0.0.1/",
            "http://[::1]:8080/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://169.254.169.254/latest/meta-data",
            "http://[fe80::1]/",
            "http://0.0.0.0:80/",
            "http://0/",
            "http://localhost:9000/in",
            "https://LOCALHOST./",
            "http://api.localhost/",
        ] {
            let url = check_url(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            let e = check_not_local(&url).expect_err(raw);
            assert!(e.to_string().contains("--allow-local"), "{raw}: {e}");
        }
        for ok in [
            "https://hooks.example/x",
            "http://192.0.2.10:8080/",
            "http://[2001:db8::1]/",
        ] {
            check_not_local(&check_url(ok).unwrap()).unwrap();
        }
    }

    #[test]
    fn events_are_checked() {
        assert_eq!(
            parse_events("sent, campaign.finished,sent").unwrap(),
            vec![EventKind::Sent, EventKind::CampaignFinished]
        );
        assert!(matches!(parse_events(" , "), Err(WebhookError::NoEvents)));
        assert!(matches!(
            parse_events("sent,delivered"),
            Err(WebhookError::UnknownEvent(e)) if e == "delivered"
        ));
    }

    #[test]
    fn signature_is_hmac_of_time_dot_body() {
        // HMAC-SHA256("key", "1.{}"), from Python's hmac module.
        let sig = sign("key", 1, b"{}");
        assert_eq!(
            sig,
            "t=1,v1=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
        );
        assert_ne!(sign("key", 2, b"{}"), sig);
        assert_ne!(sign("other", 1, b"{}"), sig);
    }
}
