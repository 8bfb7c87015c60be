//! What the user asked for: defaults, and the parsing and checking of raw
//! command-line and environment values into typed settings. Nothing here
//! connects to anything; errors here are usage errors (exit code 2).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Embedded default database: a SQLite file in the current directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://mailsplit.db";
/// A local beanstalkd on its standard port.
pub const DEFAULT_BEANSTALKD: &str = "127.0.0.1:11300";
pub const DEFAULT_TUBE: &str = "mailsplit";
/// A relay on this machine, plain SMTP.
pub const DEFAULT_SMTP_URL: &str = "smtp://127.0.0.1:25";
/// Recipients per job (the design's "jobs of 100").
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Upper bound on ids in one job a worker accepts; larger bodies are buried.
pub const MAX_JOB_RECIPIENTS: usize = 1_000;
/// Concurrent SMTP sessions per worker process.
pub const DEFAULT_CONCURRENCY: usize = 100;
/// Tries per recipient for transient failures (4xx, timeouts) before it is
/// recorded as failed.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;
/// How long a stopping worker lets jobs in flight finish before handing the
/// rest back.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// Default bound on connecting and on one message's SMTP exchange.
pub const DEFAULT_SMTP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a worker reloads its campaigns' pause/cancel flags: a pause
/// (by command or by SQL) takes effect within about this long.
pub const FLAG_REFRESH: Duration = Duration::from_millis(500);
/// `serve`'s public listener (one-click unsubscribe), and its admin one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";

/// A worker's settings, checked (see `cli` for where they come from).
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub database_url: String,
    pub servers: Vec<SocketAddr>,
    pub tube: String,
    pub smtp: SmtpUrl,
    /// Concurrent SMTP sessions.
    pub concurrency: usize,
    /// Tries per recipient for transient failures.
    pub max_attempts: i32,
    /// How long a stopping worker lets jobs in flight finish.
    pub grace: Duration,
    /// Bound on connecting and on each message's SMTP exchange.
    pub smtp_timeout: Duration,
}

/// `mailsplit serve`'s settings, checked.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub database_url: String,
    pub servers: Vec<SocketAddr>,
    pub tube: String,
    /// Public routes (one-click unsubscribe): what a reverse proxy exposes.
    pub listen: SocketAddr,
    /// Admin routes (dashboard, API, metrics).
    pub admin_listen: SocketAddr,
    /// Bearer token every admin request must carry; `None` only with a
    /// loopback admin address.
    pub admin_token: Option<String>,
    /// Bearer token of `POST /webhooks/bounce` on the public listener; the
    /// route does not exist without one.
    pub webhook_token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("bad beanstalkd address {0:?}: expected HOST:PORT (several separated by commas)")]
    BadBeanstalkd(String),
    #[error("beanstalkd address {0:?} does not resolve to an IPv4 address")]
    NoIpv4(String),
    #[error("bad tube name {0:?}: 1-200 characters of A-Z a-z 0-9 - + / ; . $ _ ( ), not starting with -")]
    BadTube(String),
    /// `url` is already redacted.
    #[error("bad SMTP URL {url:?}: {why} (expected smtp://HOST:PORT, smtp://USER:PASS@HOST:587?tls=required or smtps://HOST:465)")]
    BadSmtpUrl { url: String, why: String },
    #[error("bad {what} address {value:?}: expected HOST:PORT, e.g. 127.0.0.1:8080")]
    BadListen { what: &'static str, value: String },
    #[error("refusing to serve the admin routes on {0}, which is not a loopback address, without a token: set MAILSPLIT_ADMIN_TOKEN")]
    AdminWithoutToken(SocketAddr),
    /// `url` is already redacted.
    #[error("bad --public-url {url:?}: {why} (expected https://HOST[/PATH], e.g. https://mail.example.com; http:// only for a loopback host)")]
    BadPublicUrl { url: String, why: &'static str },
    #[error("{what} must be between {min} and {max}, got {value}")]
    OutOfRange {
        what: &'static str,
        value: usize,
        min: usize,
        max: usize,
    },
}

/// `host:port[,host:port…]` into resolved IPv4 socket addresses, in order.
pub fn parse_beanstalkd(list: &str) -> Result<Vec<SocketAddr>, ConfigError> {
    let mut out = Vec::new();
    for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !raw.contains(':') {
            return Err(ConfigError::BadBeanstalkd(raw.to_string()));
        }
        let addrs = raw
            .to_socket_addrs()
            .map_err(|_| ConfigError::BadBeanstalkd(raw.to_string()))?;
        let v4 = addrs
            .into_iter()
            .find(SocketAddr::is_ipv4)
            .ok_or_else(|| ConfigError::NoIpv4(raw.to_string()))?;
        out.push(v4);
    }
    if out.is_empty() {
        return Err(ConfigError::BadBeanstalkd(list.to_string()));
    }
    Ok(out)
}

/// beanstalkd's tube-name rules, checked up front for a clear message.
pub fn check_tube(tube: &str) -> Result<(), ConfigError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-+/;.$_()".contains(c);
    if tube.is_empty() || tube.len() > 200 || tube.starts_with('-') || !tube.chars().all(ok_char) {
        return Err(ConfigError::BadTube(tube.to_string()));
    }
    Ok(())
}

/// Check a count option against sane bounds.
pub fn check_range(
    what: &'static str,
    value: usize,
    min: usize,
    max: usize,
) -> Result<usize, ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange {
            what,
            value,
            min,
            max,
        });
    }
    Ok(value)
}

/// How an SMTP session is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// Plain text: for a relay on localhost or a trusted network.
    None,
    /// STARTTLS when offered; `required` refuses to go on without it.
    StartTls { required: bool },
    /// TLS from the first byte (`smtps://`, port 465).
    Implicit,
}

/// A parsed SMTP relay URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpUrl {
    pub host: String,
    pub port: u16,
    pub tls: Tls,
    pub credentials: Option<(String, String)>,
    /// PEM file of an extra root certificate to trust (a private CA).
    pub ca: Option<String>,
}

impl SmtpUrl {
    pub fn parse(raw: &str) -> Result<SmtpUrl, ConfigError> {
        let bad = |why: &str| ConfigError::BadSmtpUrl {
            url: crate::redact::url(raw),
            why: why.to_string(),
        };
        let url = url::Url::parse(raw).map_err(|e| bad(&e.to_string()))?;
        let (default_port, mut tls) = match url.scheme() {
            "smtp" => (25, Tls::None),
            "smtps" => (465, Tls::Implicit),
            other => return Err(bad(&format!("unknown scheme {other:?}"))),
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let mut ca = None;
        for (key, value) in url.query_pairs() {
            match (key.as_ref(), value.as_ref(), tls) {
                ("ca", path, _) => ca = Some(path.to_string()),
                ("tls", "required", Tls::None) => tls = Tls::StartTls { required: true },
                ("tls", "opportunistic", Tls::None) => tls = Tls::StartTls { required: false },
                ("tls", "none", Tls::None) => {}
                ("tls", _, Tls::Implicit) => return Err(bad("smtps:// is always TLS; drop ?tls=")),
                ("tls", v, _) => {
                    return Err(bad(&format!(
                        "tls={v:?}: use tls=required, tls=opportunistic or tls=none"
                    )))
                }
                (k, _, _) => return Err(bad(&format!("unknown parameter {k:?}"))),
            }
        }
        let credentials = if url.username().is_empty() {
            None
        } else {
            let decode = |s: &str| {
                url::form_urlencoded::parse(format!("x={s}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            };
            Some((decode(url.username()), decode(url.password().unwrap_or(""))))
        };
        Ok(SmtpUrl {
            host,
            port: url.port().unwrap_or(default_port),
            tls,
            credentials,
            ca,
        })
        .and_then(|u| match (&u.ca, u.tls) {
            (Some(_), Tls::None) => Err(bad("ca= needs TLS: add tls=required or use smtps://")),
            _ => Ok(u),
        })
    }
}

/// Longest `--public-url`: a token and `/u/` still fit in a header line
/// and in any link.
pub const MAX_PUBLIC_URL: usize = 200;

/// `campaign create --public-url`: the base of the one-click unsubscribe
/// links, `https://` (receivers POST to it from the internet; RFC 8058
/// requires https), or `http://` only for a loopback host (tests, a local
/// try-out). No user-info (a password in every message), query or
/// fragment. Returned without a trailing `/`, its host in A-labels.
pub fn parse_public_url(raw: &str) -> Result<String, ConfigError> {
    let bad = |why| ConfigError::BadPublicUrl {
        url: crate::redact::url(raw),
        why,
    };
    let url = url::Url::parse(raw.trim()).map_err(|_| bad("not a URL"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost" || d.ends_with(".localhost"),
        None => return Err(bad("no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => return Err(bad("http:// is only for a loopback host; use https://")),
        _ => return Err(bad("not an https:// URL")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "it holds a user name or password, which every message would show",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(
            "it has a query or fragment; /u/TOKEN is appended to its path",
        ));
    }
    let out = url.as_str().trim_end_matches('/').to_string();
    if out.len() > MAX_PUBLIC_URL {
        return Err(bad("longer than 200 characters"));
    }
    Ok(out)
}

/// A listen address, `HOST:PORT`, resolved.
pub fn parse_listen(what: &'static str, raw: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::BadListen {
        what,
        value: raw.to_string(),
    };
    raw.trim()
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_urls() {
        let plain = SmtpUrl::parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tls),
            ("127.0.0.1", 2525, Tls::None)
        );
        let sub =
            SmtpUrl::parse("smtp://me%40x.org:p%3Ass@relay.example:587?tls=required").unwrap();
        assert_eq!(sub.tls, Tls::StartTls { required: true });
        assert_eq!(sub.credentials, Some(("me@x.org".into(), "p:ss".into())));
        let smtps = SmtpUrl::parse("smtps://relay.example?ca=/etc/ca.pem").unwrap();
        assert_eq!(smtps.ca.as_deref(), Some("/etc/ca.pem"));
        assert!(SmtpUrl::parse("smtp://relay.example?ca=/etc/ca.pem").is_err());
        assert_eq!((smtps.port, smtps.tls), (465, Tls::Implicit));
        assert!(SmtpUrl::parse("http://x").is_err());
        assert!(SmtpUrl::parse("smtp://x?tls=maybe").is_err());
        let err = SmtpUrl::parse("smtp://u:secret@h?tls=bad")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn beanstalkd_lists() {
        let two = parse_beanstalkd("127.0.0.1:1, localhost:2").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].port(), 2);
        assert!(parse_beanstalkd("nohost").is_err());
        assert!(parse_beanstalkd("").is_err());
    }

    #[test]
    fn public_urls() {
        let ok = |u: &str| parse_public_url(u).unwrap();
        assert_eq!(ok("https://mail.example.com/"), "https://mail.example.com");
        assert_eq!(ok("https://Example.COM/mail/"), "https://example.com/mail");
        assert_eq!(ok("https://bücher.de"), "https://xn--bcher-kva.de");
        assert_eq!(ok("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(ok("http://[::1]:8080/x"), "http://[::1]:8080/x");
        assert_eq!(ok("http://localhost:1"), "http://localhost:1");
        for bad in [
            "http://mail.example.com",
            "http://10.0.0.1",
            "ftp://example.com",
            "javascript:alert(1)",
            "example.com",
            "https://example.com/?a=1",
            "https://example.com/#x",
            "",
        ] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
        let err = parse_public_url("https://u:s3cret@example.com")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn tubes() {
        assert!(check_tube("mailsplit").is_ok());
        assert!(check_tube("-x").is_err());
        assert!(check_tube("a b").is_err());
    }
}
