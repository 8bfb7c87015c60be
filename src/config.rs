//! What the user asked for: defaults, and the parsing and checking of raw
//! command-line and environment values into typed settings. Nothing here
//! connects to anything; errors here are usage errors (exit code 2).

mod addresses;
pub mod token_policy;
mod trusted_proxy;

pub use addresses::{
    parse_beanstalkd, parse_listen, parse_public_url, parse_resolver, SmtpUrl, Tls, MAX_PUBLIC_URL,
};

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::redact;
pub use trusted_proxy::TrustedProxy;

/// Embedded default database: a SQLite file in the current directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://mailsplit.db";
/// A local beanstalkd on its standard port.
pub const DEFAULT_BEANSTALKD: &str = "127.0.0.1:11300";
pub const DEFAULT_TUBE: &str = "mailsplit";
/// A relay on this machine, plain SMTP.
pub const DEFAULT_SMTP_URL: &str = "smtp://127.0.0.1:25";
/// Recipients per job (the design's "jobs of 100").
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// How long `enqueue` waits while another run enqueues the same campaign.
pub const DEFAULT_ENQUEUE_WAIT: Duration = Duration::from_secs(600);
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
/// Messages per SMTP session before it QUITs (KumoMTA's default is 1024).
pub const DEFAULT_MAX_PER_SESSION: usize = 500;
/// Bound on connecting and waiting for the relay's greeting (and EHLO,
/// STARTTLS, AUTH), below `--smtp-timeout` when that is larger: a relay at
/// its process limit accepts the connection but never greets it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a worker reloads its campaigns' pause/cancel flags: a pause
/// (by command or by SQL) takes effect within about this long.
pub const FLAG_REFRESH: Duration = Duration::from_millis(500);
/// How often a worker rewrites its heartbeat row (see `mailsplit workers`).
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// A worker whose heartbeat is older than this is shown as lost (killed,
/// or its machine or database connection gone). Several heartbeats long,
/// so a slow write or a little clock skew between machines is no alarm.
pub const LOST_AFTER: Duration = Duration::from_secs(15);

/// This machine's name, as enqueue leases, connection leases and worker
/// heartbeats record it (one spelling, so a run can recognise its own host).
pub fn host_name() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
/// A lost worker's row is deleted once it has been silent this long (by
/// the next worker that starts): long enough for anyone to notice it.
pub const FORGET_LOST: Duration = Duration::from_secs(24 * 3600);
/// `serve`'s public listener (one-click unsubscribe), and its admin one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";
/// Connections each of `serve`'s listeners holds at most (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Longest campaign name `campaign create` accepts.
pub const MAX_CAMPAIGN_NAME: usize = 100;

/// A worker's settings, checked (see `cli` for where they come from).
/// `Debug` shows the database URL through [`redact`].
#[derive(Clone)]
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
    /// Messages per SMTP session before it QUITs.
    pub max_per_session: usize,
    /// Bytes one rendered message may hold; a larger one is failed.
    pub max_message: usize,
    pub webhooks: WebhookDelivery,
    /// The DNS server `mx:` rate groups ask (`None`: the system's).
    pub resolver: Option<SocketAddr>,
}

/// The first webhook retry's delay; each failure in a row doubles it.
pub const DEFAULT_WEBHOOK_RETRY_BASE: Duration = Duration::from_secs(5);
/// Webhook events a receiver did not take within this are dropped and
/// counted as failed.
pub const DEFAULT_WEBHOOK_GIVE_UP: Duration = Duration::from_secs(24 * 3600);

/// How workers and `serve` deliver webhooks (env
/// `MAILSPLIT_WEBHOOK_RETRY_BASE_MS`, `MAILSPLIT_WEBHOOK_GIVE_UP_SECS`:
/// tests shorten them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookDelivery {
    pub retry_base: Duration,
    pub give_up: Duration,
}

impl Default for WebhookDelivery {
    fn default() -> Self {
        WebhookDelivery {
            retry_base: DEFAULT_WEBHOOK_RETRY_BASE,
            give_up: DEFAULT_WEBHOOK_GIVE_UP,
        }
    }
}

/// `mailsplit serve`'s settings, checked. `Debug` hides the tokens and the
/// database URL's password.
#[derive(Clone)]
pub struct ServeSettings {
    pub database_url: String,
    pub servers: Vec<SocketAddr>,
    pub tube: String,
    /// Public routes (one-click unsubscribe): what a reverse proxy exposes.
    pub listen: SocketAddr,
    /// Admin routes (dashboard, API, metrics).
    pub admin_listen: SocketAddr,
    /// Connections each listener holds at most.
    pub max_connections: usize,
    /// Bearer token every admin request must carry; `None` only with a
    /// loopback admin address.
    pub admin_token: Option<String>,
    /// Bearer token of `POST /webhooks/bounce` on the public listener; the
    /// route does not exist without one.
    pub webhook_token: Option<String>,
    /// Outgoing event webhooks.
    pub webhooks: WebhookDelivery,
    /// Reverse proxies whose `X-Forwarded-For` names the client
    /// (`--trusted-proxy`); empty: the header is never read.
    pub trusted_proxies: Vec<TrustedProxy>,
    /// `/api/v1` requests per second each key may make on average.
    pub api_rate: u32,
    /// Requests a key may make at once above its rate.
    pub api_burst: u32,
    /// `MAILSPLIT_PUBLIC_URL`: the base of the links the subscribers'
    /// pages mail (`/confirm/TOKEN`); `None`: `/subscribe` takes no
    /// double-opt-in sign-ups.
    pub public_url: Option<String>,
    /// `MAILSPLIT_CONFIRM_FROM`: the sender of the built-in confirmation
    /// mail; `None`: `no-reply@` the public URL's host.
    pub confirm_from: Option<String>,
    /// `SMTP_URL` (the workers' relay): where the dashboard's test sends
    /// go, as `campaign test --smtp`; read when one is asked for.
    pub smtp_url: String,
}

/// `serve --api-rate`'s default.
pub const DEFAULT_API_RATE: u32 = 50;
/// `serve --api-burst`'s default.
pub const DEFAULT_API_BURST: u32 = 100;

impl fmt::Debug for WorkerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerSettings")
            .field("database_url", &redact::Url(&self.database_url))
            .field("servers", &self.servers)
            .field("tube", &self.tube)
            .field("smtp", &self.smtp)
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .field("grace", &self.grace)
            .field("smtp_timeout", &self.smtp_timeout)
            .field("max_per_session", &self.max_per_session)
            .field("max_message", &self.max_message)
            .field("resolver", &self.resolver)
            .finish()
    }
}

impl fmt::Debug for ServeSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeSettings")
            .field("database_url", &redact::Url(&self.database_url))
            .field("servers", &self.servers)
            .field("tube", &self.tube)
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("max_connections", &self.max_connections)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| redact::Hidden),
            )
            .field(
                "webhook_token",
                &self.webhook_token.as_ref().map(|_| redact::Hidden),
            )
            .field("smtp_url", &redact::Url(&self.smtp_url))
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Token(#[from] token_policy::TokenError),
    #[error("bad beanstalkd address {0:?}: expected HOST:PORT (several separated by commas)")]
    BadBeanstalkd(String),
    #[error(
        "beanstalkd host {host:?} does not resolve ({why}): check the name, or give an IP address"
    )]
    Unresolvable { host: String, why: String },
    #[error("beanstalkd address {0:?} does not resolve to an IPv4 address")]
    NoIpv4(String),
    #[error("bad tube name {0:?}: 1-200 characters of A-Z a-z 0-9 - + / ; . $ _ ( ), not starting with -")]
    BadTube(String),
    /// `url` is already redacted.
    #[error("bad SMTP URL {url:?}: {why} (expected smtp://HOST:PORT, smtp://USER:PASS@HOST:587?tls=required or smtps://HOST:465)")]
    BadSmtpUrl { url: String, why: String },
    /// `url` is already redacted.
    #[error("SMTP URL {url:?} has a password but no TLS: AUTH would send it in clear text. Use smtp://USER:PASS@HOST:587?tls=required (STARTTLS) or smtps://USER:PASS@HOST:465; for a relay on this machine only, add ?tls=none&auth=plain-insecure")]
    AuthInClear { url: String },
    #[error("bad campaign name {name:?}: {why}")]
    BadCampaignName { name: String, why: &'static str },
    #[error("bad --resolver {0:?}: expected a DNS server as HOST:PORT, e.g. 1.1.1.1:53")]
    BadResolver(String),
    #[error("bad {what} address {value:?}: expected HOST:PORT, e.g. 127.0.0.1:8080")]
    BadListen { what: &'static str, value: String },
    #[error("refusing to serve the admin routes on {0}, which is not a loopback address, without a token: set MAILSPLIT_ADMIN_TOKEN")]
    AdminWithoutToken(SocketAddr),
    /// `url` is already redacted.
    #[error("bad --public-url {url:?}: {why} (expected https://HOST[/PATH], e.g. https://mail.example.com; http:// only for a loopback host)")]
    BadPublicUrl { url: String, why: &'static str },
    #[error("bad MAILSPLIT_CONFIRM_FROM {0:?}: use user@example.com or \"Name <user@example.com>\", on a domain you send from")]
    BadConfirmFrom(String),
    #[error("bad --trusted-proxy {0:?}: expected an IP address or network, e.g. 10.0.0.5 or 10.0.0.0/8 (several separated by commas)")]
    BadTrustedProxy(String),
    #[error("{what}={value:?} is not a whole number")]
    NotANumber { what: &'static str, value: String },
    #[error("{what} must be between {min} and {max}, got {value}")]
    OutOfRange {
        what: &'static str,
        value: usize,
        min: usize,
        max: usize,
    },
}

/// beanstalkd's tube-name rules, checked up front for a clear message.
pub fn check_tube(tube: &str) -> Result<(), ConfigError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-+/;.$_()".contains(c);
    if tube.is_empty() || tube.len() > 200 || tube.starts_with('-') || !tube.chars().all(ok_char) {
        return Err(ConfigError::BadTube(tube.to_string()));
    }
    Ok(())
}

/// A campaign is named by its name or its id, so a name must not look like
/// an id (it would shadow the campaign with that id); it is shown on one
/// line in `status` and logs.
pub fn check_campaign_name(name: &str) -> Result<(), ConfigError> {
    let bad = |why| {
        Err(ConfigError::BadCampaignName {
            name: name.to_string(),
            why,
        })
    };
    if name.trim().is_empty() {
        bad("it is empty")
    } else if name.chars().all(|c| c.is_ascii_digit()) {
        bad("all digits would shadow the campaign with that id; add a letter, e.g. \"spring-2025\"")
    } else if name.chars().any(char::is_control) {
        bad("it holds a control character (newline, tab, …)")
    } else if name.chars().count() > MAX_CAMPAIGN_NAME {
        bad("longer than 100 characters")
    } else {
        Ok(())
    }
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
    fn passwords_are_percent_decoded_not_form_decoded() {
        let u = SmtpUrl::parse("smtps://me:a+b%2Bc%20d%25@relay.example").unwrap();
        assert_eq!(u.credentials, Some(("me".into(), "a+b+c d%".into())));
        let err = SmtpUrl::parse("smtps://me:%FF@relay.example").unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }

    #[test]
    fn a_password_needs_tls_or_an_explicit_loopback_exception() {
        let err = SmtpUrl::parse("smtp://u:s3cr3t@relay.example:587").unwrap_err();
        assert!(matches!(err, ConfigError::AuthInClear { .. }), "{err}");
        let shown = err.to_string();
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("tls=required"), "{shown}");
        assert!(SmtpUrl::parse("smtp://u:p@relay.example:587?tls=none").is_err());
        // Opportunistic parses; the session refuses AUTH if TLS does not happen.
        let opp = SmtpUrl::parse("smtp://u:p@relay.example:587?tls=opportunistic").unwrap();
        assert!(!opp.auth_in_clear);
        for loopback in ["127.0.0.1", "localhost", "[::1]"] {
            let u = SmtpUrl::parse(&format!(
                "smtp://u:p@{loopback}:25?tls=none&auth=plain-insecure"
            ))
            .unwrap();
            assert!(u.auth_in_clear, "{loopback}");
        }
        let err = SmtpUrl::parse("smtp://u:p@relay.example:25?tls=none&auth=plain-insecure")
            .unwrap_err()
            .to_string();
        assert!(err.contains("relay.example"), "{err}");
        assert!(SmtpUrl::parse("smtp://127.0.0.1:25?auth=maybe").is_err());
        // No password, no AUTH: plain text stays fine for a local relay.
        assert!(SmtpUrl::parse("smtp://relay.example:25").is_ok());
    }

    #[test]
    fn debug_prints_hide_secrets() {
        let smtp = SmtpUrl::parse("smtps://user:Pa55word@relay.example").unwrap();
        let worker = WorkerSettings {
            database_url: "postgres://me:DbPa55@db/x".into(),
            servers: vec![],
            tube: "t".into(),
            smtp: smtp.clone(),
            concurrency: 1,
            max_attempts: 1,
            grace: DEFAULT_GRACE,
            smtp_timeout: DEFAULT_SMTP_TIMEOUT,
            max_per_session: DEFAULT_MAX_PER_SESSION,
            max_message: 1_000_000,
            webhooks: WebhookDelivery::default(),
            resolver: None,
        };
        let serve = ServeSettings {
            database_url: "postgres://me:DbPa55@db/x".into(),
            servers: vec![],
            tube: "t".into(),
            listen: "127.0.0.1:1".parse().unwrap(),
            admin_listen: "127.0.0.1:2".parse().unwrap(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            admin_token: Some("T0ken".into()),
            webhook_token: Some("W3bhook".into()),
            webhooks: WebhookDelivery::default(),
            trusted_proxies: vec![],
            api_rate: DEFAULT_API_RATE,
            api_burst: DEFAULT_API_BURST,
            public_url: None,
            confirm_from: None,
            smtp_url: "smtp://relay:S3cret@mail:587".into(),
        };
        for shown in [
            format!("{smtp:?}"),
            format!("{worker:?}"),
            format!("{worker:#?}"),
            format!("{serve:?}"),
        ] {
            for secret in ["Pa55word", "DbPa55", "T0ken", "W3bhook", "S3cret"] {
                assert!(!shown.contains(secret), "{shown}");
            }
            assert!(shown.contains("***"), "{shown}");
        }
    }

    #[test]
    fn campaign_names() {
        assert!(check_campaign_name("spring-2025").is_ok());
        assert!(check_campaign_name("Frühling").is_ok());
        for bad in ["", "  ", "3", "0042", "a\nb", "tab\there", &"x".repeat(101)] {
            assert!(check_campaign_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_campaign_name(&"é".repeat(100)).is_ok());
    }

    #[test]
    fn beanstalkd_lists() {
        let two = parse_beanstalkd("127.0.0.1:1, localhost:2").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].port(), 2);
        assert!(parse_beanstalkd("nohost").is_err());
        assert!(parse_beanstalkd("").is_err());
        assert!(matches!(
            parse_beanstalkd("127.0.0.1:notaport"),
            Err(ConfigError::BadBeanstalkd(_))
        ));
        assert!(matches!(
            parse_beanstalkd("no-such-host.invalid:11300"),
            Err(ConfigError::Unresolvable { .. })
        ));
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

    #[test]
    fn trusted_proxies_are_addresses_or_networks() {
        let one = TrustedProxy::parse("192.0.2.7").unwrap();
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(one.contains("::ffff:192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        let net = TrustedProxy::parse("10.0.0.0/8").unwrap();
        assert!(net.contains("10.200.3.4".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let v6 = TrustedProxy::parse("[fd00::]/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        let all = TrustedProxy::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        for bad in ["", "proxy.example", "10.0.0.0/33", "::/129", "1.2.3.4/x"] {
            assert!(TrustedProxy::parse(bad).is_err(), "{bad}");
        }
    }
}
