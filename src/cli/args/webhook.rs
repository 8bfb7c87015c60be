//! `mailsplit webhook`'s subcommands, as clap sees them.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum WebhookCommand {
    /// Add a receiver; prints its id (and the secret, once, if generated)
    Add {
        /// http:// or https:// URL the events are POSTed to
        url: String,
        /// sent, failed, bounced, complained, unsubscribed, opened, clicked, campaign.finished
        #[arg(long)]
        events: String,
        /// Signing secret (default: 32 random bytes, printed once)
        #[arg(long)]
        secret: Option<String>,
        /// Let the URL point at this machine or its link (loopback, link-local): for a receiver on this host
        #[arg(long)]
        allow_local: bool,
    },
    /// Every webhook: URL, events, delivered, pending, failed, last error
    Ls,
    /// Remove a webhook (by the id `webhook ls` shows); its waiting events are dropped
    Rm { id: i64 },
}
