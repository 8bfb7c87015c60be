//! The long-running processes' arguments: `worker`, `bounce`, `serve`,
//! and `campaign test`, which talks to the relay as a worker does.

use std::path::PathBuf;

use clap::Args;

use crate::config::{self, DEFAULT_CONCURRENCY};
use crate::redact;

/// `campaign test`'s options. `Debug` shows the SMTP URL through [`redact`].
#[derive(Args, Clone)]
pub struct TestArgs {
    /// Campaign name or id
    pub name: String,
    /// Where the test messages go (comma-separated or repeated)
    #[arg(long, required = true, value_delimiter = ',')]
    pub to: Vec<String>,
    /// The list member the message is rendered for (default: the first active one)
    #[arg(long)]
    pub recipient: Option<String>,
    /// SMTP relay, as for `worker`
    #[arg(long, env = "SMTP_URL", hide_env_values = true, default_value = config::DEFAULT_SMTP_URL)]
    pub smtp: String,
}

impl std::fmt::Debug for TestArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestArgs")
            .field("name", &self.name)
            .field("to", &self.to)
            .field("recipient", &self.recipient)
            .field("smtp", &redact::Url(&self.smtp))
            .finish()
    }
}

/// `Debug` shows the SMTP URL through [`redact`].
#[derive(Args, Clone)]
pub struct WorkerArgs {
    /// SMTP relay: smtp://HOST:PORT, smtp://USER:PASS@HOST:587?tls=required, smtps://HOST:465
    #[arg(long, env = "SMTP_URL", hide_env_values = true, default_value = config::DEFAULT_SMTP_URL)]
    pub smtp: String,
    /// Concurrent SMTP sessions in this process
    #[arg(long, env = "MAILSPLIT_CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Tries per recipient on temporary (4xx) failures before it is failed
    #[arg(long, default_value_t = config::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: i32,
    /// Seconds a stopping worker lets jobs in flight finish
    #[arg(long, default_value_t = config::DEFAULT_GRACE.as_secs())]
    pub grace: u64,
    /// Seconds to wait for the relay (connect, and each message's exchange)
    /// before counting the try as a temporary failure
    #[arg(long, default_value_t = config::DEFAULT_SMTP_TIMEOUT.as_secs())]
    pub smtp_timeout: u64,
    /// Messages per SMTP session; then the session QUITs and its
    /// connection slot is free for another sender or worker
    #[arg(long, env = "MAILSPLIT_MAX_PER_SESSION", default_value_t = config::DEFAULT_MAX_PER_SESSION)]
    pub max_per_session: usize,
    /// Bytes one rendered message may hold (subject, HTML and text parts,
    /// and the message built from them); a recipient whose message is
    /// larger is failed with that reason
    #[arg(long, env = "MAILSPLIT_MAX_MESSAGE_SIZE", default_value_t = crate::compose::content::DEFAULT_MAX_MESSAGE)]
    pub max_message_size: usize,
    /// The DNS server (IP:PORT) that `mx:` rate groups ask for recipient
    /// domains' MX hosts (default: the system's resolvers)
    #[arg(long, env = "MAILSPLIT_RESOLVER", value_name = "HOST:PORT")]
    pub resolver: Option<String>,
}

impl std::fmt::Debug for WorkerArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerArgs")
            .field("smtp", &redact::Url(&self.smtp))
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .field("grace", &self.grace)
            .field("smtp_timeout", &self.smtp_timeout)
            .field("max_per_session", &self.max_per_session)
            .field("max_message_size", &self.max_message_size)
            .field("resolver", &self.resolver)
            .finish()
    }
}

#[derive(Args, Debug, Clone)]
pub struct BounceArgs {
    /// The envelope recipient of the report (pipe(8)'s ${recipient}): its
    /// VERP token names campaign and recipient
    pub recipient: Option<String>,
    /// Handle every message in DIR/new instead of stdin, moving each to
    /// DIR/cur
    #[arg(long, value_name = "DIR")]
    pub maildir: Option<PathBuf>,
    /// Soft bounces (mailbox full, temporary failures) that make a
    /// recipient bounced…
    #[arg(long, default_value_t = crate::bounce::DEFAULT_SOFT_LIMIT)]
    pub soft_limit: u32,
    /// …within this many days
    #[arg(long, default_value_t = crate::bounce::DEFAULT_SOFT_WINDOW_DAYS)]
    pub soft_window_days: u32,
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Public routes (one-click unsubscribe), HOST:PORT
    #[arg(long, env = "MAILSPLIT_LISTEN", default_value = config::DEFAULT_LISTEN)]
    pub listen: String,
    /// Admin routes (dashboard, API, metrics), HOST:PORT
    #[arg(long, env = "MAILSPLIT_ADMIN_LISTEN", default_value = config::DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: String,
    /// Connections each listener holds at most; at the cap the one idle longest is closed
    #[arg(long, env = "MAILSPLIT_MAX_CONNECTIONS", default_value_t = config::DEFAULT_MAX_CONNECTIONS as u64, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub max_connections: u64,
    /// Reverse proxy (IP address or ADDR/BITS) whose X-Forwarded-For names the client; repeat or separate by commas
    #[arg(
        long = "trusted-proxy",
        value_name = "ADDR",
        env = "MAILSPLIT_TRUSTED_PROXY",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<String>,
    /// /api/v1 requests per second each API key may make on average (429 beyond)
    #[arg(long, env = "MAILSPLIT_API_RATE", default_value_t = config::DEFAULT_API_RATE, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_rate: u32,
    /// /api/v1 requests each API key may make at once above its rate
    #[arg(long, env = "MAILSPLIT_API_BURST", default_value_t = config::DEFAULT_API_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_burst: u32,
}
