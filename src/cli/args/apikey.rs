//! `mailsplit apikey`'s subcommands, as clap sees them.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum ApikeyCommand {
    /// Make a key for /api/v1; prints it once (only its hash is stored)
    Create {
        /// A name to list and revoke it by (letters, digits, '.', '_', '-')
        name: String,
        /// What it may do, comma-separated: send, subscribers, campaigns, read
        #[arg(long, value_delimiter = ',', value_enum, required = true)]
        scopes: Vec<ScopeArg>,
    },
    /// Every key: name, scopes, created, last used (never the key)
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Refuse a key from the next request on
    Revoke { name: String },
}

/// A scope as typed (the stage's `Scope`, which the CLI does not name).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeArg {
    Send,
    Subscribers,
    Campaigns,
    Read,
}

impl ScopeArg {
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeArg::Send => "send",
            ScopeArg::Subscribers => "subscribers",
            ScopeArg::Campaigns => "campaigns",
            ScopeArg::Read => "read",
        }
    }
}
