//! The command line as clap sees it: commands, flags, their help and their
//! environment variables. Nothing here checks a value beyond its type;
//! [`super::resolve`] turns these into settings.

use clap::{Args, Parser, Subcommand};

use crate::config::{self, DEFAULT_BATCH_SIZE};

mod ab;
mod apikey;
mod audience;
mod campaign;
mod dkim;
mod doctor;
mod flow;
mod messages;
mod people;
mod processes;
mod rate_warmup;
mod webhook;
use crate::redact;
pub use ab::AbArgs;
pub use apikey::{ApikeyCommand, ScopeArg};
pub use audience::{ImportArgs, ListCommand, ListFaceArgs};
pub use campaign::{CreateArgs, EditArgs, TemplatesCommand};
pub use dkim::{Algorithm, DkimCommand};
pub use doctor::DoctorArgs;
pub use flow::FlowCommand;
pub use messages::{MessageCommand, SendArgs, TemplateCommand, TemplateContent};
pub use people::{SubscriberCommand, SuppressCommand};
pub use processes::{BounceArgs, ServeArgs, TestArgs, WorkerArgs};
pub use rate_warmup::WarmupArgs;
pub use webhook::WebhookCommand;

#[derive(Parser, Debug)]
#[command(
    name = "mailsplit",
    version,
    about = "Send one email campaign to a million recipients over beanstalkd, exactly once each.",
    long_about = "Send one email campaign to a million recipients over beanstalkd, exactly once each.\n\n\
A typical run:\n  \
mailsplit migrate\n  \
mailsplit import people.csv --list customers\n  \
mailsplit campaign create spring --list customers --template newsletter \\\n      \
--subject 'Spring news' --from news@example.com\n  \
mailsplit enqueue spring\n  \
mailsplit worker --smtp smtp://127.0.0.1:25     # one or more, e.g. under supervisord\n  \
mailsplit status spring"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// `Debug` shows the database URL through [`redact`].
#[derive(Args, Clone)]
pub struct Global {
    /// Database: sqlite://FILE (default, created on `migrate`) or postgres://USER@HOST/DB
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, default_value = config::DEFAULT_DATABASE_URL, global = true)]
    pub database_url: String,
    /// beanstalkd server(s), HOST:PORT; a comma-separated list spreads jobs over several
    #[arg(long, env = "BEANSTALKD", default_value = config::DEFAULT_BEANSTALKD, global = true)]
    pub beanstalkd: String,
    /// beanstalkd tube the jobs go through
    #[arg(long, env = "MAILSPLIT_TUBE", default_value = config::DEFAULT_TUBE, global = true)]
    pub tube: String,
}

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Global")
            .field("database_url", &redact::Url(&self.database_url))
            .field("beanstalkd", &self.beanstalkd)
            .field("tube", &self.tube)
            .finish()
    }
}

// why: one value, parsed once per process; boxing a variant would only
// make every match on it longer
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or upgrade the database schema (safe to run again)
    Migrate,
    /// Load recipients from a CSV file with a header row into a list
    ///
    /// Column `email` is required, `name` is optional, `status` (active,
    /// unsubscribed, bounced) is optional; every other column becomes a
    /// template attribute. Bad rows are reported with their line number and
    /// skipped. Importing again updates recipients, never duplicates them,
    /// and changes only the columns the file has (an empty cell clears
    /// that attribute). A mailbox twice in one file: the first row wins,
    /// the others are reported. Nobody who unsubscribed, bounced or
    /// complained is made active again unless --resubscribe.
    Import(ImportArgs),
    /// Create and list campaigns
    #[command(subcommand)]
    Campaign(CampaignCommand),
    /// Manage lists: ls, rm, delete
    #[command(subcommand)]
    List(ListCommand),
    /// Every recipient who unsubscribed, bounced or complained: email,
    /// what, when, campaign (to update your own database)
    ///
    /// `when` is RFC 3339 (UTC). For incremental runs pass the latest
    /// `when` you have seen as --since: changes at or after it are printed
    /// again, never missed.
    Optouts {
        /// Only status changes at or after this RFC 3339 time, e.g. 2026-11-26T09:00:00Z
        #[arg(long)]
        since: Option<String>,
        /// How to print them
        #[arg(long, value_enum, default_value_t = Format::Csv)]
        format: Format,
    },
    /// List the built-in starter templates, or show one's source
    Templates {
        #[command(subcommand)]
        command: Option<TemplatesCommand>,
    },
    /// Put a campaign's recipients into beanstalkd, one job per batch
    ///
    /// Safe to run again after a crash: it continues where it stopped and
    /// never enqueues a recipient twice. One run per campaign at a time: a
    /// second run waits for the first. A run killed with -9 gives the
    /// campaign up at once to a run on the same machine, within 30 s to one
    /// on another.
    Enqueue {
        /// Campaign name or id
        campaign: String,
        /// Recipients per job
        #[arg(long, default_value_t = DEFAULT_BATCH_SIZE)]
        batch_size: usize,
        /// Seconds to wait while another run enqueues the same campaign
        #[arg(long, default_value_t = config::DEFAULT_ENQUEUE_WAIT.as_secs())]
        wait: u64,
    },
    /// Send queued mail: reserve jobs, send over SMTP, record every outcome
    ///
    /// Runs until SIGTERM/SIGINT or until its own executable is replaced
    /// (a deploy), then finishes or hands back the jobs in flight and exits 0.
    Worker(WorkerArgs),
    /// Shared rate limits per relay, campaign or recipient domain
    #[command(subcommand)]
    Rate(RateCommand),
    /// DKIM keys: workers sign every message whose From domain has one
    #[command(subcommand)]
    Dkim(DkimCommand),
    /// Check a sending domain's DNS before the first send: one line each
    ///
    /// DKIM (each active key's TXT record matches the key), SPF (and the
    /// relay's address), DMARC, From aligned with DKIM and the return
    /// path, the return path domain's MX, the one-click unsubscribe URL
    /// over https. Each line says pass, warn or FAIL and the fix; exits 1
    /// when a check fails.
    Doctor(DoctorArgs),
    /// Signed event webhooks out (delivered by workers and `serve`): add, ls, rm
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Message templates for transactional messages: create, edit, ls, rm
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Send one transactional message now, ahead of every campaign
    Send(SendArgs),
    /// Transactional messages: show
    #[command(subcommand)]
    Message(MessageCommand),
    /// Flows: mail sent by itself when a member joins (create, ls, pause, resume)
    #[command(subcommand)]
    Flow(FlowCommand),
    /// Keys for the HTTP API (/api/v1): create, ls, revoke
    #[command(subcommand)]
    Apikey(ApikeyCommand),
    /// The suppression list: addresses and @domains never mailed (add, import, ls, rm)
    #[command(subcommand)]
    Suppress(SuppressCommand),
    /// What is held about one person: show, export (every row, JSON)
    #[command(subcommand)]
    Subscriber(SubscriberCommand),
    /// Outcomes by domain, bounce reasons, unsubscribes, versions, rate per minute
    Report {
        /// Campaign name or id
        campaign: String,
        #[arg(long)]
        json: bool,
        /// Recipient domains shown; the rest are summed as "other"
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Stop sending a campaign (workers notice within a second)
    Pause {
        /// Campaign name or id
        campaign: String,
    },
    /// Continue a paused campaign where it stopped
    Resume {
        /// Campaign name or id
        campaign: String,
    },
    /// Stop a campaign for good; workers delete its remaining jobs
    Cancel {
        /// Campaign name or id
        campaign: String,
    },
    /// Print the message one recipient of a campaign would get (MIME source)
    ///
    /// Its links (unsubscribe, tracked links, the open pixel) name nobody,
    /// so a link clicked while reading a preview changes no recipient and
    /// counts for no campaign; everything else is the recipient's message.
    Preview {
        /// Campaign name or id
        campaign: String,
        /// Recipient email (default: the first member of the campaign's list)
        #[arg(long)]
        recipient: Option<String>,
        /// Print the recipient's real links instead: following one acts for
        /// the recipient (unsubscribes them, counts a click)
        #[arg(long)]
        real_links: bool,
    },
    /// Serve HTTP: one-click unsubscribe (public) and the admin routes
    ///
    /// The public listener is what a reverse proxy exposes at the campaigns'
    /// public URL. The admin listener needs the bearer token in
    /// MAILSPLIT_ADMIN_TOKEN; without one it binds to loopback only. Runs
    /// until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Record a bounce or complaint report (Postfix pipe transport, Maildir)
    ///
    /// Reads one message on stdin, as Postfix's pipe(8) delivers it, and
    /// takes the envelope recipient (the VERP address) as an optional
    /// argument. master.cf:
    ///
    ///   mailsplit unix - n n - 10 pipe
    ///     flags=Rq user=mailsplit argv=/usr/local/bin/mailsplit bounce ${recipient}
    ///
    /// and in main.cf: `mailsplit_destination_recipient_limit = 1` and a
    /// transport_maps entry sending the bounce domain to `mailsplit:`.
    /// Exit 0 when the message was recorded or ignored (not a report, or
    /// nobody of ours), 75 (EX_TEMPFAIL: Postfix keeps the message and
    /// tries again) when the database cannot be reached.
    Bounce(BounceArgs),
    /// Put jobs again for every recipient of a campaign without a final outcome
    ///
    /// For a campaign whose jobs beanstalkd lost (restarted without a
    /// binlog, tube emptied): it stays "sending" with recipients pending
    /// and nobody working on them. Safe to run twice and while workers run;
    /// the ledger still sends each recipient once.
    Requeue {
        /// Campaign name or id
        campaign: String,
        /// Also retry failed deliveries (after fixing the relay), except to
        /// recipients who bounced or unsubscribed
        #[arg(long)]
        failed: bool,
        /// Recipients per job
        #[arg(long, default_value_t = DEFAULT_BATCH_SIZE)]
        batch_size: usize,
    },
    /// The worker fleet: host, pid, binary, state, last heartbeat, rate
    ///
    /// Every worker writes a heartbeat row every 2 s and deletes it when it
    /// exits cleanly. A worker silent for 15 s is shown as lost (killed, or
    /// cut off from the database); its row is forgotten after a day. During
    /// a deploy, the summary line counts the workers on the newest binary.
    Workers {
        /// One JSON object per worker, one per line
        #[arg(long)]
        json: bool,
    },
    /// Show counts, state, rate and ETA of one or all campaigns
    Status {
        /// Campaign name or id (all campaigns when omitted)
        campaign: Option<String>,
        /// One JSON object per campaign, one per line
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum RateCommand {
    /// Create or change a rate group shared by every worker
    ///
    /// GROUP is relay:HOST:PORT (a worker's --smtp relay), campaign:NAME,
    /// domain:DOMAIN (recipients at that domain), domain:* (every domain
    /// without a group of its own) or mx:SUFFIX (every domain whose
    /// preferred MX host ends in SUFFIX, e.g. mx:google.com for Gmail and
    /// Workspace). A message counts against each group that applies to it.
    Set {
        /// relay:HOST:PORT, campaign:NAME, domain:DOMAIN, domain:* or mx:SUFFIX
        group: String,
        /// Rate: N/s, N/m, N/h or N/d, from 1/d to 100000/s
        rate: String,
        /// Tokens that may be spent at once after a quiet spell (default: a tenth of a second's worth, at least 1; at most 100000)
        #[arg(long)]
        burst: Option<u32>,
        /// relay: groups only: SMTP sessions all workers together may hold
        /// open to the relay (its process limit, a provider's per-IP cap); 0
        /// removes the limit
        #[arg(long)]
        connections: Option<u32>,
    },
    /// The groups with their configured and observed rates
    List,
    /// Start a group slow and let it grow day by day: mail past a day's allowance waits for the next day
    ///
    /// Day k allows min(START × FACTOR^k, UNTIL) for one day (--every), counted across every worker; within a day mail goes at the group's rate (a new group is created at UNTIL). `rate list` shows the day, its allowance and what is used; `status` shows how many days a campaign takes.
    Warmup(WarmupArgs),
    /// Remove a group (its mail is no longer limited by it)
    Delete { group: String },
}

// Parsed once per run: the size of `Create` costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum CampaignCommand {
    /// Create a campaign for a list
    ///
    /// The content is exactly one of --html FILE [--text FILE],
    /// --markdown FILE or --template NAME.
    #[command(group = clap::ArgGroup::new("content").required(true).multiple(false))]
    Create(CreateArgs),
    /// Change a draft, scheduled or paused campaign: each edit is a new content
    /// version, checked as `create` checks it; workers send the new one
    /// from the first message after `resume`
    #[command(group = clap::ArgGroup::new("body").multiple(false))]
    Edit(EditArgs),
    /// One line per campaign
    List,
    /// Send test messages now: rendered for one list member, subject
    /// "[TEST] …", through the workers' relay; the ledger is untouched
    Test(TestArgs),
    /// Delete a campaign made by mistake: only a draft or a scheduled
    /// campaign that sent nothing (its jobs are dropped); exit 2 naming
    /// the state otherwise
    Delete {
        /// Campaign name or id
        name: String,
    },
}

/// How a listing is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// With a header row.
    Csv,
    /// One object per line.
    Json,
}

#[cfg(test)]
mod tests;
