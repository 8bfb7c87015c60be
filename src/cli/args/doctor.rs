//! `mailsplit doctor`'s arguments, as clap sees them.

use clap::Args;

use crate::config;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The From domain to check, e.g. example.com
    pub domain: String,
    /// Ask this DNS server (IP:PORT) instead of the system's resolvers,
    /// e.g. 1.1.1.1:53 to see what the internet sees past a local cache
    #[arg(long, value_name = "HOST:PORT")]
    pub resolver: Option<String>,
    /// The campaigns' VERP return path (its domain needs SPF and an MX)
    #[arg(long, env = "MAILSPLIT_RETURN_PATH")]
    pub return_path: Option<String>,
    /// Where `mailsplit serve`'s public listener is reachable (the
    /// one-click unsubscribe links); checked over https
    #[arg(long, env = "MAILSPLIT_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The workers' SMTP relay: when its host is an IP address, SPF must allow it
    #[arg(long, env = "SMTP_URL", hide_env_values = true, default_value = config::DEFAULT_SMTP_URL)]
    pub smtp: String,
}
