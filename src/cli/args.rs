//! The command line as clap sees it: commands, flags, their help and their
//! environment variables. Nothing here checks a value beyond its type;
//! [`super::resolve`] turns these into settings.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY};

mod ab;
mod apikey;
mod doctor;
mod flow;
mod messages;
mod people;
mod webhook;
use crate::redact;
pub use ab::AbArgs;
pub use apikey::{ApikeyCommand, ScopeArg};
pub use doctor::DoctorArgs;
pub use flow::FlowCommand;
pub use messages::{MessageCommand, SendArgs, TemplateCommand, TemplateContent};
pub use people::{SubscriberCommand, SuppressCommand};
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

/// `import`'s arguments; `Debug` shows the source URL through [`redact`].
#[derive(Args, Clone)]
pub struct ImportArgs {
    /// CSV file to read (or --from-sql with --source)
    #[arg(required_unless_present = "from_sql", conflicts_with = "from_sql")]
    pub file: Option<PathBuf>,
    /// List to add the recipients to (created if new)
    #[arg(long)]
    pub list: String,
    /// Read the recipients from this SELECT on --source instead of a
    /// file: column `email` required, `name` and `status` optional, every
    /// other column an attribute with its type kept (NULL leaves it out)
    #[arg(long, value_name = "QUERY", requires = "source")]
    pub from_sql: Option<String>,
    /// The database --from-sql reads, read-only: postgres://USER@HOST/DB,
    /// mysql://USER:PASSWORD@HOST/DB or sqlite://PATH. A password given
    /// here shows in `ps` to every user of this machine: set
    /// MAILSPLIT_SOURCE_URL instead
    #[arg(
        long,
        env = "MAILSPLIT_SOURCE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub source: Option<String>,
    /// Read --source as a user who can do more than read (a superuser,
    /// server file access, the right to write the tables); refused
    /// without this (README: "A read-only user for --source")
    #[arg(long, requires = "from_sql")]
    pub allow_privileged_source: bool,
    /// Afterwards the list's members are exactly the rows imported:
    /// members not in the source leave the list (their recipient rows,
    /// history and other lists stay)
    #[arg(long)]
    pub sync: bool,
    /// With --sync: a source that names nobody empties the list (without
    /// it, such an import is refused, exit 2)
    #[arg(long, requires = "sync")]
    pub allow_empty: bool,
    /// Let rows saying active (or saying nothing) make active again
    /// recipients who unsubscribed, bounced or complained; without it
    /// they stay as they are and are counted as "kept unsubscribed"
    #[arg(long)]
    pub resubscribe: bool,
}

impl std::fmt::Debug for ImportArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportArgs")
            .field("file", &self.file)
            .field("list", &self.list)
            .field("from_sql", &self.from_sql)
            .field("source", &self.source.as_deref().map(redact::Url))
            .field("allow_privileged_source", &self.allow_privileged_source)
            .field("sync", &self.sync)
            .field("allow_empty", &self.allow_empty)
            .field("resubscribe", &self.resubscribe)
            .finish()
    }
}

#[derive(Subcommand, Debug)]
pub enum ListCommand {
    /// Make an empty list by hand, with the face subscribers see: its
    /// title, whether `/subscribe` offers it (`--public`) and whether
    /// joining there needs a confirmed mail (`--double-opt-in`). Lists
    /// made by `import` stay private and single opt-in until `list set`.
    Create {
        /// The list's name (what `--list` and `campaign create` use)
        name: String,
        #[command(flatten)]
        face: ListFaceArgs,
    },
    /// Print an HTML form to paste into a web page: it posts to
    /// MAILSPLIT_PUBLIC_URL/subscribe (served by `mailsplit serve`) and
    /// joins the list, with its double opt-in if it has one. The list
    /// must be public.
    Form {
        name: String,
        /// Where `serve`'s public listener is reached (default:
        /// MAILSPLIT_PUBLIC_URL)
        #[arg(long, env = "MAILSPLIT_PUBLIC_URL", value_name = "URL")]
        public_url: Option<String>,
    },
    /// Change a list's title, public or double opt-in
    Set {
        name: String,
        #[command(flatten)]
        face: ListFaceArgs,
    },
    /// Every list: name, members, active members (who may be mailed),
    /// public and double opt-in, title
    Ls,
    /// Take recipients off a list (they stay on file, with their history
    /// and other lists)
    Rm {
        list: String,
        /// Addresses, any spelling of the mailbox
        #[arg(required = true)]
        emails: Vec<String>,
    },
    /// Delete a list (its recipients stay on file); refused while one of
    /// its campaigns is enqueuing, sending or paused
    Delete { list: String },
}

/// A list's face, for `list create` and `list set`.
#[derive(clap::Args, Debug, Default)]
pub struct ListFaceArgs {
    /// What the sign-up form and preference centre call the list
    /// (default: its name)
    #[arg(long, value_name = "T")]
    pub title: Option<String>,
    /// Offer the list on the public `/subscribe` form and the preference
    /// centre
    #[arg(long, conflicts_with = "private")]
    pub public: bool,
    /// Take the list off `/subscribe` (its members stay)
    #[arg(long)]
    pub private: bool,
    /// Sign-ups through `/subscribe` join only after clicking the
    /// confirmation mail's link and its button
    #[arg(long, conflicts_with = "single_opt_in")]
    pub double_opt_in: bool,
    /// Sign-ups through `/subscribe` join at once
    #[arg(long)]
    pub single_opt_in: bool,
}

#[derive(Subcommand, Debug)]
pub enum TemplatesCommand {
    /// Print a built-in starter's source (HTML and text, Jinja syntax), to
    /// copy into your own files for `campaign create --html FILE --text FILE`
    Show {
        /// Template name (see `mailsplit templates`)
        name: String,
        /// Only the HTML part
        #[arg(long, conflicts_with = "text")]
        html: bool,
        /// Only the text part
        #[arg(long)]
        text: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum RateCommand {
    /// Create or change a rate group shared by every worker
    ///
    /// GROUP is relay:HOST:PORT (a worker's --smtp relay), campaign:NAME,
    /// domain:DOMAIN (recipients at that domain) or domain:* (every domain
    /// without a group of its own). A message counts against each group
    /// that applies to it.
    Set {
        /// relay:HOST:PORT, campaign:NAME, domain:DOMAIN or domain:*
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
    /// Remove a group (its mail is no longer limited by it)
    Delete { group: String },
}

#[derive(Subcommand, Debug)]
pub enum DkimCommand {
    /// Generate a key for a domain, store it, and print the DNS TXT record
    ///
    /// Publish the record before sending: receivers look the key up at
    /// SELECTOR._domainkey.DOMAIN. One active key per algorithm and domain;
    /// a domain with an RSA and an ed25519 key gets both signatures.
    Keygen {
        /// The From domain to sign for, e.g. example.com
        domain: String,
        /// Selector: the DNS label the key is published under (default
        /// mailsplit; mailsplit-ed25519 when the domain already uses mailsplit)
        #[arg(long)]
        selector: Option<String>,
        /// What the key signs with
        #[arg(long, value_enum, default_value_t = Algorithm::Rsa)]
        algorithm: Algorithm,
    },
    /// Domains, selectors, algorithms, states (active, pending, retired) and
    /// the TXT record of each key
    List,
    /// Delete a domain's keys; its mail goes out unsigned
    Delete {
        domain: String,
        /// Delete only the key with this selector
        #[arg(long)]
        selector: Option<String>,
    },
    /// Make a new key for a domain (pending) and print its TXT record
    ///
    /// Mail stays signed with the active key until `dkim activate`, so the
    /// new record can be published first.
    Rotate {
        domain: String,
        /// What the new key signs with (default: the algorithm of the
        /// domain's active key)
        #[arg(long, value_enum)]
        algorithm: Option<Algorithm>,
        /// Selector of the new key (default mailsplit-YYYYMMDD)
        #[arg(long)]
        selector: Option<String>,
    },
    /// Sign the domain's mail with this key from now on (workers within
    /// seconds); the active key of its algorithm is retired
    Activate { domain: String, selector: String },
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
    Create {
        /// Unique campaign name
        name: String,
        /// Recipient list (from `mailsplit import --list`)
        #[arg(long)]
        list: String,
        /// HTML file: a Jinja template (name, email, attributes.KEY,
        /// unsubscribe_url, campaign.name); its <style> CSS is inlined
        #[arg(long, value_name = "FILE", group = "content")]
        html: Option<PathBuf>,
        /// Text part for --html (default: derived from the HTML)
        #[arg(long, value_name = "FILE", requires = "html")]
        text: Option<PathBuf>,
        /// Markdown file (a Jinja template too): both parts are made from it
        #[arg(long, value_name = "FILE", group = "content")]
        markdown: Option<PathBuf>,
        /// A built-in starter template (see `mailsplit templates`)
        #[arg(long, value_name = "NAME", group = "content")]
        template: Option<String>,
        /// Subject line, a Jinja template too ("Hi {{ name }}")
        #[arg(long)]
        subject: String,
        /// Sender address, e.g. news@example.com or "Shop <news@example.com>"
        #[arg(long)]
        from: String,
        /// beanstalkd priority, lower is sooner. Default: smaller lists get
        /// a lower number, so a small campaign overtakes a big one.
        #[arg(long)]
        priority: Option<u32>,
        /// Where `mailsplit serve` is reachable from the internet, e.g.
        /// https://mail.example.com: every message gets a one-click
        /// unsubscribe link <public-url>/u/TOKEN (List-Unsubscribe, and the
        /// templates' unsubscribe link). https only; http for loopback hosts
        #[arg(long, env = "MAILSPLIT_PUBLIC_URL")]
        public_url: Option<String>,
        /// VERP return path, e.g. bounces@bounce.example.com: each message's
        /// envelope sender becomes bounces+TOKEN@bounce.example.com, and
        /// that domain's mail goes to `mailsplit bounce` (see its --help)
        #[arg(long, env = "MAILSPLIT_RETURN_PATH")]
        return_path: Option<String>,
        /// Workers pause the campaign when more than this share of its last
        /// 250-500 messages failed, or 100 failed in a row: 20%, 0.2, or off
        #[arg(long, default_value = "20%")]
        max_failure_rate: String,
        /// Start no earlier than this (RFC 3339, e.g.
        /// 2026-12-01T09:00:00+01:00); `enqueue` may run any time before,
        /// no message leaves before it. A past time is refused
        #[arg(long, value_name = "TIME")]
        send_at: Option<String>,
        /// Track opens (a 1x1 image <public-url>/o/TOKEN) and/or clicks
        /// (http(s) links rewritten to <public-url>/c/TOKEN/N): opens,
        /// clicks, opens,clicks or none (the default); needs --public-url
        #[arg(long, value_name = "opens,clicks")]
        track: Option<String>,
        #[command(flatten)]
        ab: AbArgs,
    },
    /// Change a draft, scheduled or paused campaign: each edit is a new content
    /// version, checked as `create` checks it; workers send the new one
    /// from the first message after `resume`
    #[command(group = clap::ArgGroup::new("body").multiple(false))]
    Edit {
        /// Campaign name or id
        name: String,
        /// New subject line (a Jinja template)
        #[arg(long)]
        subject: Option<String>,
        /// New HTML file (as for create)
        #[arg(long, value_name = "FILE", group = "body")]
        html: Option<PathBuf>,
        /// New text part (with --html, or alone for --html content)
        #[arg(long, value_name = "FILE")]
        text: Option<PathBuf>,
        /// New Markdown file (as for create)
        #[arg(long, value_name = "FILE", group = "body", conflicts_with = "text")]
        markdown: Option<PathBuf>,
        /// New sender address
        #[arg(long)]
        from: Option<String>,
        /// New start time (RFC 3339), or `now`: a scheduled campaign's
        /// workers see it within a second (alone, it stores no new content
        /// version)
        #[arg(long, value_name = "TIME")]
        send_at: Option<String>,
        /// What to track from now on: opens, clicks, opens,clicks, or none
        /// (or empty) to stop
        #[arg(long, value_name = "opens,clicks")]
        track: Option<String>,
    },
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

/// How a listing is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// With a header row.
    Csv,
    /// One object per line.
    Json,
}

/// `--algorithm`: what a DKIM key signs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algorithm {
    /// RSA 2048 with SHA-256: verified by every receiver.
    Rsa,
    /// Ed25519 (RFC 8463): small and fast, not yet verified everywhere.
    Ed25519,
}

impl From<Algorithm> for crate::dkim::DkimAlgorithm {
    fn from(a: Algorithm) -> Self {
        match a {
            Algorithm::Rsa => crate::dkim::DkimAlgorithm::Rsa,
            Algorithm::Ed25519 => crate::dkim::DkimAlgorithm::Ed25519,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_the_parsed_command_line_hides_passwords() {
        let cli = Cli::try_parse_from([
            "mailsplit",
            "--database-url",
            "postgres://me:DbS3cret@db/x",
            "worker",
            "--smtp",
            "smtps://u:SmtpS3cret@relay:465",
        ])
        .unwrap();
        let shown = format!("{cli:?} {cli:#?}");
        assert!(!shown.contains("DbS3cret"), "{shown}");
        assert!(!shown.contains("SmtpS3cret"), "{shown}");
        assert!(shown.contains("relay:465"), "{shown}");
    }

    #[test]
    fn debug_of_an_sql_import_hides_the_source_password() {
        let cli = Cli::try_parse_from([
            "mailsplit",
            "import",
            "--list",
            "shop",
            "--from-sql",
            "SELECT email FROM customers",
            "--source",
            "postgres://shop:SrcS3cret@db/shop",
        ])
        .unwrap();
        let shown = format!("{cli:?} {cli:#?}");
        assert!(!shown.contains("SrcS3cret"), "{shown}");
        assert!(shown.contains("customers"), "{shown}");
    }
}
