//! Arguments → settings: each command's raw options, checked and turned
//! into the values its stage takes (ripgrep's low args → high args). A bad
//! value fails here, naming the option, before anything is opened.

use std::net::SocketAddr;
use std::time::Duration;

use crate::bounce;
use crate::config::{self, ConfigError, ServeSettings, SmtpUrl, WorkerSettings};

use super::args::{BounceArgs, Global, ServeArgs, WorkerArgs};

/// The environment variable that holds the admin token (never a flag: a
/// flag shows in `ps`).
pub const ADMIN_TOKEN_ENV: &str = "MAILSPLIT_ADMIN_TOKEN";
/// The environment variable that holds the bounce webhook's token; without
/// it `serve` has no webhook route.
pub const WEBHOOK_TOKEN_ENV: &str = "MAILSPLIT_WEBHOOK_TOKEN";

/// `worker`'s options, checked, into its settings.
pub fn worker_settings(g: &Global, args: &WorkerArgs) -> Result<WorkerSettings, ConfigError> {
    config::check_tube(&g.tube)?;
    let smtp_timeout =
        config::check_range("--smtp-timeout", args.smtp_timeout as usize, 1, 3_600)? as u64;
    Ok(WorkerSettings {
        database_url: g.database_url.clone(),
        servers: config::parse_beanstalkd(&g.beanstalkd)?,
        tube: g.tube.clone(),
        smtp: SmtpUrl::parse(&args.smtp)?,
        concurrency: config::check_range("--concurrency", args.concurrency, 1, 5_000)?,
        max_attempts: config::check_range(
            "--max-attempts",
            args.max_attempts.max(0) as usize,
            1,
            100,
        )? as i32,
        grace: Duration::from_secs(args.grace),
        smtp_timeout: Duration::from_secs(smtp_timeout),
        max_per_session: config::check_range(
            "--max-per-session",
            args.max_per_session,
            1,
            1_000_000,
        )?,
        // Up to what one render's fuel can make (64 bytes a unit): a larger
        // cap would never be reached.
        max_message: config::check_range(
            "--max-message-size",
            args.max_message_size,
            1_000,
            64 * crate::compose::content::RENDER_FUEL as usize,
        )?,
        webhooks: webhook_delivery()?,
        resolver: args
            .resolver
            .as_deref()
            .map(config::parse_resolver)
            .transpose()?,
    })
}

/// `serve`'s options, checked, into its settings: the admin routes are
/// never reachable from another machine without a token.
pub fn serve_settings(g: &Global, args: &ServeArgs) -> Result<ServeSettings, ConfigError> {
    use config::token_policy;
    config::check_tube(&g.tube)?;
    let admin_listen = config::parse_listen("--admin-listen", &args.admin_listen)?;
    let admin_token = token_policy::admin(
        ADMIN_TOKEN_ENV,
        std::env::var(ADMIN_TOKEN_ENV).ok(),
        admin_listen,
    )?;
    if admin_token.is_none() && !admin_listen.ip().is_loopback() {
        return Err(ConfigError::AdminWithoutToken(admin_listen));
    }
    Ok(ServeSettings {
        database_url: g.database_url.clone(),
        servers: config::parse_beanstalkd(&g.beanstalkd)?,
        tube: g.tube.clone(),
        listen: config::parse_listen("--listen", &args.listen)?,
        admin_listen,
        max_connections: args.max_connections as usize,
        admin_token,
        webhook_token: token_policy::read(
            WEBHOOK_TOKEN_ENV,
            std::env::var(WEBHOOK_TOKEN_ENV).ok(),
        )?,
        webhooks: webhook_delivery()?,
        trusted_proxies: args
            .trusted_proxies
            .iter()
            .filter(|t| !t.trim().is_empty())
            .map(|t| config::TrustedProxy::parse(t))
            .collect::<Result<_, _>>()?,
        api_rate: args.api_rate,
        api_burst: args.api_burst,
        public_url: std::env::var("MAILSPLIT_PUBLIC_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .map(|u| config::parse_public_url(&u))
            .transpose()?,
        confirm_from: confirm_from()?,
        smtp_url: std::env::var("SMTP_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| config::DEFAULT_SMTP_URL.into()),
    })
}

/// `MAILSPLIT_CONFIRM_FROM`, checked as a From address.
fn confirm_from() -> Result<Option<String>, ConfigError> {
    let Some(raw) = std::env::var("MAILSPLIT_CONFIRM_FROM")
        .ok()
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(None);
    };
    crate::compose::parse_from(&raw).map_err(|_| ConfigError::BadConfirmFrom(raw.clone()))?;
    Ok(Some(raw.trim().to_string()))
}

/// The environment variable with the first webhook retry's delay (ms).
pub const WEBHOOK_RETRY_BASE_ENV: &str = "MAILSPLIT_WEBHOOK_RETRY_BASE_MS";
/// The environment variable with how long webhook events are retried (s).
pub const WEBHOOK_GIVE_UP_ENV: &str = "MAILSPLIT_WEBHOOK_GIVE_UP_SECS";

/// Webhook delivery as the environment tunes it (defaults otherwise).
fn webhook_delivery() -> Result<config::WebhookDelivery, ConfigError> {
    let mut d = config::WebhookDelivery::default();
    if let Some(ms) = env_number(WEBHOOK_RETRY_BASE_ENV, 1, 3_600_000)? {
        d.retry_base = Duration::from_millis(ms);
    }
    if let Some(s) = env_number(WEBHOOK_GIVE_UP_ENV, 1, 30 * 24 * 3600)? {
        d.give_up = Duration::from_secs(s);
    }
    Ok(d)
}

/// A whole number from the environment, within `min..=max`.
fn env_number(name: &'static str, min: usize, max: usize) -> Result<Option<u64>, ConfigError> {
    let Ok(text) = std::env::var(name) else {
        return Ok(None);
    };
    let n: usize = text.trim().parse().map_err(|_| ConfigError::NotANumber {
        what: name,
        value: text.clone(),
    })?;
    Ok(Some(config::check_range(name, n, min, max)? as u64))
}

/// What `enqueue` and `requeue` put jobs with: the checked batch size and
/// beanstalkd servers (and tube).
pub fn queue_options(
    g: &Global,
    batch_size: usize,
) -> Result<(usize, Vec<SocketAddr>), ConfigError> {
    let batch_size =
        config::check_range("--batch-size", batch_size, 1, config::MAX_JOB_RECIPIENTS)?;
    let servers = config::parse_beanstalkd(&g.beanstalkd)?;
    config::check_tube(&g.tube)?;
    Ok((batch_size, servers))
}

/// `bounce`'s soft-bounce options, checked.
pub fn bounce_settings(args: &BounceArgs) -> Result<bounce::Settings, ConfigError> {
    let soft_limit = config::check_range("--soft-limit", args.soft_limit as usize, 1, 1_000)?;
    let days = config::check_range(
        "--soft-window-days",
        args.soft_window_days as usize,
        1,
        3_650,
    )?;
    Ok(bounce::Settings {
        soft_limit: soft_limit as u32,
        soft_window: Duration::from_secs(days as u64 * 86_400),
    })
}
