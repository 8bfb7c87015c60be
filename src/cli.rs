//! The command line: clap definitions, and one function per subcommand that
//! turns checked options into calls on the stages. `main.rs` only maps the
//! result to an exit code.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::compose;
use crate::config::{
    self, ServeSettings, SmtpUrl, WorkerSettings, DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY,
};
use crate::control;
use crate::fleet;
use crate::import;
use crate::redact;
use crate::splitter;
use crate::status::CampaignStatus;
use crate::store::campaigns::{self, Control, NewCampaign};
use crate::store::{self, connections, dkim_keys, rates, recipients, workers, Conn};
use crate::templates;

/// Exit code for usage errors (unknown campaign, bad argument, bad URL).
pub const EXIT_USAGE: u8 = 2;

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

/// Parse the command line. clap's own messages (a usage error, `--help`)
/// quote what was typed, which may be a URL with a password (`mailsplit
/// worker smtp://user:pass@…`, a forgotten `--smtp`): they are printed
/// through [`redact::text`]. `Err` holds the exit code (0 after `--help`).
pub fn parse() -> std::result::Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        let to_stderr = e.use_stderr();
        let terminal = if to_stderr {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        let rendered = e.render();
        let shown = redact::text(&if terminal {
            rendered.ansi().to_string()
        } else {
            rendered.to_string()
        });
        // A closed pipe (`mailsplit --help | head -1`) is no error.
        let _ = if to_stderr {
            std::io::Write::write_all(&mut std::io::stderr(), shown.as_bytes())
        } else {
            std::io::Write::write_all(&mut std::io::stdout(), shown.as_bytes())
        };
        ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE))
    })
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or upgrade the database schema (safe to run again)
    Migrate,
    /// Load recipients from a CSV file with a header row into a list
    ///
    /// Column `email` is required, `name` is optional, `status` (active,
    /// unsubscribed, bounced) is optional; every other column becomes a
    /// template attribute. Bad rows are reported with their line number and
    /// skipped. Importing again updates recipients, never duplicates them.
    Import {
        /// CSV file to read
        file: PathBuf,
        /// List to add the recipients to (created if new)
        #[arg(long)]
        list: String,
    },
    /// Create and list campaigns
    #[command(subcommand)]
    Campaign(CampaignCommand),
    /// List the templates compiled into this binary
    Templates,
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
    Preview {
        /// Campaign name or id
        campaign: String,
        /// Recipient email (default: the first member of the campaign's list)
        #[arg(long)]
        recipient: Option<String>,
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
    /// SELECTOR._domainkey.DOMAIN. One key per algorithm and domain; a
    /// domain with an RSA and an ed25519 key gets both signatures.
    Keygen {
        /// The From domain to sign for, e.g. example.com
        domain: String,
        /// Selector: the DNS label the key is published under
        #[arg(long, default_value = DEFAULT_DKIM_SELECTOR)]
        selector: String,
        /// rsa (2048 bits, verified everywhere) or ed25519 (RFC 8463)
        #[arg(long, default_value = "rsa", value_parser = ["rsa", "ed25519"])]
        algorithm: String,
    },
    /// Domains, selectors, algorithms and the TXT record of each key
    List,
    /// Delete a domain's keys; its mail goes out unsigned
    Delete {
        domain: String,
        /// Delete only the key with this selector
        #[arg(long)]
        selector: Option<String>,
    },
}

/// `dkim keygen`'s selector when none is given.
pub const DEFAULT_DKIM_SELECTOR: &str = "mailsplit";

#[derive(Subcommand, Debug)]
pub enum CampaignCommand {
    /// Create a campaign for a list
    Create {
        /// Unique campaign name
        name: String,
        /// Recipient list (from `mailsplit import --list`)
        #[arg(long)]
        list: String,
        /// Template name (see `mailsplit templates`)
        #[arg(long)]
        template: String,
        /// Subject line
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
    },
    /// One line per campaign
    List,
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
}

/// The environment variable that holds the admin token (never a flag: a
/// flag shows in `ps`).
pub const ADMIN_TOKEN_ENV: &str = "MAILSPLIT_ADMIN_TOKEN";
/// The environment variable that holds the bounce webhook's token; without
/// it `serve` has no webhook route.
pub const WEBHOOK_TOKEN_ENV: &str = "MAILSPLIT_WEBHOOK_TOKEN";

/// Run the parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let g = &cli.global;
    match cli.command {
        Command::Migrate => {
            let mut conn = open(g)?;
            let applied = conn.migrate()?;
            if let Some((path, mode)) = store::exposed_sqlite_file(&g.database_url) {
                eprintln!(
                    "mailsplit: note: {path} (recipients' personal data) is readable by other users (mode {mode:o}); `chmod 600 {path}` makes it private"
                );
            }
            if applied.is_empty() {
                println!("schema is up to date");
            } else {
                println!(
                    "applied {} migration(s): {}",
                    applied.len(),
                    applied.join(", ")
                );
            }
        }
        Command::Import { file, list } => cmd_import(g, &file, &list)?,
        Command::Campaign(CampaignCommand::Create {
            name,
            list,
            template,
            subject,
            from,
            priority,
            public_url,
            return_path,
            max_failure_rate,
        }) => {
            config::check_campaign_name(&name)?;
            templates::check(&template)?;
            let from = compose::parse_from(&from)?;
            let return_path = return_path
                .filter(|r| !r.trim().is_empty())
                .map(|r| compose::parse_return_path(&r))
                .transpose()?;
            let max_failure_rate = parse_failure_rate(&max_failure_rate)?;
            if subject.trim().is_empty() || subject.chars().any(char::is_control) {
                anyhow::bail!(UsageError("--subject must be one non-empty line".into()));
            }
            let public_url = public_url
                .filter(|u| !u.trim().is_empty())
                .map(|u| config::parse_public_url(&u))
                .transpose()?;
            let mut conn = open_migrated(g)?;
            let list_id = recipients::find_list(&mut conn, &list)?;
            let size = recipients::list_size(&mut conn, list_id)?;
            let priority = priority.map_or_else(|| default_priority(size), i64::from);
            let campaign = campaigns::create(
                &mut conn,
                &NewCampaign {
                    name: &name,
                    list_id,
                    template: &template,
                    subject: &subject,
                    from_addr: &from.to_string(),
                    priority,
                    recipients: size,
                    public_url: public_url.as_deref(),
                    return_path: return_path.as_deref(),
                    max_failure_rate,
                },
            )?;
            println!(
                "created campaign {:?} (id {}) for list {:?}: {} recipients, template {}, priority {}",
                campaign.name, campaign.id, list, size, template, priority
            );
            deliverability_warnings(&mut conn, &from, public_url.as_deref())?;
        }
        Command::Campaign(CampaignCommand::List) => {
            let mut conn = open_read_only(g)?;
            let all = campaigns::list(&mut conn)?;
            if all.is_empty() {
                println!("no campaigns yet; create one with `mailsplit campaign create`");
            }
            for (campaign, counters) in all {
                println!("{}", CampaignStatus::new(&campaign, &counters).line());
            }
        }
        Command::Templates => {
            for name in templates::TEMPLATES {
                println!("{name}");
            }
        }
        Command::Enqueue {
            campaign,
            batch_size,
            wait,
        } => {
            let (batch_size, servers) = queue_options(g, batch_size)?;
            let mut conn = open_migrated(g)?;
            let report = splitter::enqueue(
                &mut conn,
                &campaign,
                &splitter::Options {
                    batch_size,
                    servers,
                    tube: g.tube.clone(),
                    progress: std::io::stderr().is_terminal(),
                    wait: std::time::Duration::from_secs(wait),
                },
            )?;
            if report.already_done {
                println!("campaign {campaign:?} is already fully enqueued; nothing to do");
            } else {
                let secs = report.elapsed.as_secs_f64().max(1e-6);
                println!(
                    "enqueued {} recipients in {} jobs ({} skipped as not active) in {:.2} s, {:.0} jobs/s{}",
                    report.recipients,
                    report.jobs,
                    report.skipped,
                    secs,
                    report.jobs as f64 / secs,
                    if report.recovered { "; found the interrupted run's last jobs already queued (see the log for how many were put again)" } else { "" }
                );
            }
        }
        Command::Worker(args) => crate::worker::run(worker_settings(g, &args)?)?,
        Command::Serve(args) => crate::serve::run(serve_settings(g, &args)?)?,
        Command::Preview {
            campaign,
            recipient,
        } => {
            let mut conn = open_read_only(g)?;
            let message = compose::preview(&mut conn, &campaign, recipient.as_deref())?;
            std::io::Write::write_all(&mut std::io::stdout(), &message)?;
        }
        Command::Rate(cmd) => rate(g, cmd)?,
        Command::Dkim(cmd) => dkim(g, cmd)?,
        Command::Bounce(args) => return cmd_bounce(g, &args),
        Command::Requeue {
            campaign,
            failed,
            batch_size,
        } => {
            let (batch_size, servers) = queue_options(g, batch_size)?;
            let mut conn = open_migrated(g)?;
            let report = crate::requeue::requeue(
                &mut conn,
                &campaign,
                &crate::requeue::Options {
                    batch_size,
                    servers,
                    tube: g.tube.clone(),
                    failed,
                },
            )?;
            if failed {
                println!(
                    "{} failed deliveries to active recipients will be tried again",
                    report.reopened
                );
            }
            println!(
                "requeued {} recipients without a final outcome in {} jobs",
                report.recipients, report.jobs
            );
        }
        Command::Pause { campaign } => control(g, &campaign, Control::Pause)?,
        Command::Resume { campaign } => control(g, &campaign, Control::Resume)?,
        Command::Cancel { campaign } => control(g, &campaign, Control::Cancel)?,
        Command::Workers { json } => {
            let mut conn = open_read_only(g)?;
            let now = store::now_ms();
            let fleet = fleet::view(workers::list(&mut conn)?, now);
            if json {
                for w in &fleet.workers {
                    println!("{}", serde_json::to_string(w)?);
                }
            } else {
                println!("{}", fleet.render(now));
            }
        }
        Command::Status { campaign, json } => {
            let mut conn = open_read_only(g)?;
            let rows = match campaign {
                Some(name) => {
                    let c = campaigns::find(&mut conn, &name)?;
                    let counters = campaigns::counters(&mut conn, c.id)?;
                    vec![(c, counters)]
                }
                None => campaigns::list(&mut conn)?,
            };
            for (c, counters) in rows {
                let status = CampaignStatus::new(&c, &counters);
                if json {
                    println!("{}", serde_json::to_string(&status)?);
                } else {
                    println!("{}", status.render());
                }
            }
            if !json {
                let groups = rates::list(&mut conn)?;
                if !groups.is_empty() {
                    let usage = crate::status::live_usage(&mut conn)?;
                    println!("rate groups:");
                    for group in groups {
                        println!("  {}", crate::status::rate_line(&group, &usage));
                    }
                }
                let limits = connections::list(&mut conn)?;
                if !limits.is_empty() {
                    println!("connection limits:");
                    for limit in limits {
                        println!("  {}", crate::status::connections_line(&limit));
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn cmd_import(g: &Global, file: &std::path::Path, list: &str) -> Result<()> {
    let mut conn = open_migrated(g)?;
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("importing");
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let started = std::time::Instant::now();
    let mut shown = 0u32;
    let summary = import::import_file(
        &mut conn,
        file,
        list,
        |r| {
            // Every rejected row is reported; a flood is summarised.
            if shown < 1_000 {
                bar.suspend(|| eprintln!("{}: line {}: {}", file.display(), r.line, r.reason));
            } else if shown == 1_000 {
                bar.suspend(|| eprintln!("(more rejected rows not shown)"));
            }
            shown += 1;
        },
        |rows| {
            bar.set_message(format!("importing: {rows} rows read"));
            bar.tick();
        },
    )?;
    bar.finish_and_clear();
    println!(
        "list {list:?}: imported {} / updated {} / skipped {} in {:.1} s",
        summary.imported,
        summary.updated,
        summary.skipped,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn rate(g: &Global, cmd: RateCommand) -> Result<()> {
    match cmd {
        RateCommand::Set {
            group,
            rate,
            burst,
            connections: sessions,
        } => {
            let set = crate::ratelimit::setting(&group, &rate, burst)
                .map_err(|e| UsageError(e.to_string()))?;
            let (group, per_second, burst) = (set.group, set.per_second, set.burst);
            if sessions.is_some() && !group.starts_with("relay:") {
                return Err(UsageError(format!(
                    "--connections applies to relay:HOST:PORT groups, not {group:?}"
                ))
                .into());
            }
            let mut conn = open_migrated(g)?;
            if let Some(name) = group.strip_prefix("campaign:") {
                let named = match campaigns::find(&mut conn, name) {
                    Ok(c) => c.name == name,
                    Err(store::StoreError::UnknownCampaign(_)) => false,
                    Err(e) => return Err(e.into()),
                };
                if !named {
                    return Err(UsageError(format!(
                        "bad rate group {group:?}: there is no campaign {name:?}; a campaign group is campaign:NAME with the name of an existing campaign (`mailsplit status` lists them), e.g. campaign:news"
                    ))
                    .into());
                }
            }
            rates::set(&mut conn, &group, per_second, burst)?;
            let shown = crate::ratelimit::show_rate(per_second);
            println!("rate group {group}: {shown}, burst {burst}; workers pick it up within 2 s");
            match sessions {
                Some(0) => {
                    connections::delete(&mut conn, &group)?;
                    println!("connection limit of {group} removed");
                }
                Some(n) => {
                    connections::set(&mut conn, &group, i64::from(n))?;
                    println!("connection limit of {group}: {n} sessions across all workers");
                }
                None => {}
            }
        }
        RateCommand::List => {
            let mut conn = open_read_only(g)?;
            let groups = rates::list(&mut conn)?;
            if groups.is_empty() {
                println!("no rate groups; add one with `mailsplit rate set GROUP N/s`");
            }
            let usage = crate::status::live_usage(&mut conn)?;
            for group in groups {
                println!("{}", crate::status::rate_line(&group, &usage));
            }
            for limit in connections::list(&mut conn)? {
                println!("{}", crate::status::connections_line(&limit));
            }
        }
        RateCommand::Delete { group } => {
            let mut conn = open_migrated(g)?;
            let had_connections = connections::delete(&mut conn, &group)?;
            if !rates::delete(&mut conn, &group)? && !had_connections {
                return Err(UsageError(format!(
                    "no rate group {group:?}; `mailsplit rate list` shows them"
                ))
                .into());
            }
            println!("rate group {group} deleted");
        }
    }
    Ok(())
}

/// What `campaign create` says on stderr when the campaign's mail will
/// miss what large providers require of bulk mail.
fn deliverability_warnings(
    conn: &mut Conn,
    from: &lettre::message::Mailbox,
    public_url: Option<&str>,
) -> Result<()> {
    match public_url {
        Some(url) => println!("one-click unsubscribe links: {url}/u/TOKEN (serve them with `mailsplit serve`)"),
        None => eprintln!(
            "mailsplit: warning: no --public-url (or MAILSPLIT_PUBLIC_URL): the messages will carry no \
             one-click unsubscribe (RFC 8058), which Gmail, Yahoo and Outlook require of bulk mail"
        ),
    }
    let domain = compose::from_domain(from);
    if dkim_keys::for_domain(conn, &domain)?.is_empty() {
        eprintln!(
            "mailsplit: warning: {domain} has no DKIM key: the messages go out unsigned, and large \
             providers reject or junk unsigned bulk mail; `mailsplit dkim keygen {domain}` makes one"
        );
    }
    Ok(())
}

/// `dkim keygen | list | delete`.
fn dkim(g: &Global, cmd: DkimCommand) -> Result<()> {
    use crate::dkim::{self as d, DkimAlgorithm, DkimError, StoredKey};
    let mut conn = match cmd {
        DkimCommand::List => open_read_only(g)?,
        _ => open_migrated(g)?,
    };
    let domain_of =
        |raw: &str| compose::ascii_domain(raw).ok_or_else(|| DkimError::BadDomain(raw.to_string()));
    match cmd {
        DkimCommand::Keygen {
            domain,
            selector,
            algorithm,
        } => {
            let domain = domain_of(&domain)?;
            let selector = d::check_selector(&selector)?;
            let algorithm: DkimAlgorithm = algorithm.parse()?;
            let key = d::generate(algorithm)?;
            let stored = StoredKey::new(
                domain.clone(),
                selector,
                algorithm,
                data_encoding::BASE64.encode(&key.private_pkcs8),
                data_encoding::BASE64.encode(&key.public),
            );
            dkim_keys::insert(&mut conn, &stored)?;
            let size = match algorithm {
                DkimAlgorithm::Rsa => format!("rsa {} bits", d::RSA_BITS),
                DkimAlgorithm::Ed25519 => "ed25519".to_string(),
            };
            println!(
                "stored a new DKIM key for {domain} ({size}, selector {}).",
                stored.selector
            );
            println!("Publish this DNS TXT record; receivers verify the signatures with it:\n");
            print_txt(&stored);
            println!(
                "\nWorkers sign mail from {domain} for campaigns they load from now on \
                 (restart running workers to sign campaigns already in progress)."
            );
            if algorithm == DkimAlgorithm::Ed25519 {
                eprintln!(
                    "mailsplit: note: not every receiver checks ed25519 signatures yet; keep an rsa \
                     key for {domain} too (`mailsplit dkim keygen {domain} --selector OTHER`)"
                );
            }
        }
        DkimCommand::List => {
            let keys = dkim_keys::list(&mut conn)?;
            if keys.is_empty() {
                println!("no DKIM keys; make one with `mailsplit dkim keygen DOMAIN`");
            }
            for key in keys {
                println!(
                    "{}  selector {}  {}",
                    key.domain, key.selector, key.algorithm
                );
                print_txt(&key);
            }
        }
        DkimCommand::Delete { domain, selector } => {
            let domain = domain_of(&domain)?;
            let deleted = dkim_keys::delete(&mut conn, &domain, selector.as_deref())?;
            if deleted == 0 {
                return Err(UsageError(format!(
                    "no DKIM key for {domain}{}; `mailsplit dkim list` shows them",
                    selector
                        .map(|s| format!(" with selector {s}"))
                        .unwrap_or_default()
                ))
                .into());
            }
            println!(
                "deleted {deleted} DKIM key(s) of {domain}; workers sign nothing more with them once they restart; \
                 remove the TXT record only after the last signed messages are delivered"
            );
        }
    }
    Ok(())
}

/// A key's TXT record, as it is entered in a DNS provider's form and as a
/// zone-file line.
fn print_txt(key: &crate::dkim::StoredKey) {
    use crate::dkim as d;
    let name = d::txt_name(&key.selector, &key.domain);
    let value = d::txt_value(key.algorithm, &key.public_key);
    println!("  name:  {name}");
    println!("  type:  TXT");
    println!("  value: {value}");
    println!("  zone:  {name}. IN TXT {}", d::zone_strings(&value));
}

fn control(g: &Global, name: &str, action: Control) -> Result<()> {
    let servers = config::parse_beanstalkd(&g.beanstalkd)?;
    let mut conn = open_migrated(g)?;
    let done = control::control(&mut conn, &servers, &g.tube, name, action)?;
    let what = match action {
        Control::Pause => "paused; workers stop sending it within a second",
        Control::Resume => "resumed",
        Control::Cancel => "cancelled; workers delete its remaining jobs",
    };
    println!("campaign {:?} {what}", done.campaign.name);
    for (addr, kicked) in done.kicked {
        match kicked {
            Ok(0) => {}
            Ok(n) => println!("made {n} delayed jobs on {addr} ready again"),
            Err(e) => eprintln!(
                "mailsplit: note: {:#}; the campaign's jobs come back within their release delay (at most 2 min)",
                anyhow::Error::from(e)
            ),
        }
    }
    Ok(())
}

/// `worker`'s options, checked, into its settings.
fn worker_settings(g: &Global, args: &WorkerArgs) -> Result<WorkerSettings> {
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
        grace: std::time::Duration::from_secs(args.grace),
        smtp_timeout: std::time::Duration::from_secs(smtp_timeout),
        max_per_session: config::check_range(
            "--max-per-session",
            args.max_per_session,
            1,
            1_000_000,
        )?,
    })
}

/// `serve`'s options, checked, into its settings: the admin routes are
/// never reachable from another machine without a token.
fn serve_settings(g: &Global, args: &ServeArgs) -> Result<ServeSettings> {
    config::check_tube(&g.tube)?;
    let admin_listen = config::parse_listen("--admin-listen", &args.admin_listen)?;
    let admin_token = std::env::var(ADMIN_TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty());
    if admin_token.is_none() && !admin_listen.ip().is_loopback() {
        return Err(config::ConfigError::AdminWithoutToken(admin_listen).into());
    }
    Ok(ServeSettings {
        database_url: g.database_url.clone(),
        servers: config::parse_beanstalkd(&g.beanstalkd)?,
        tube: g.tube.clone(),
        listen: config::parse_listen("--listen", &args.listen)?,
        admin_listen,
        max_connections: args.max_connections as usize,
        admin_token,
        webhook_token: std::env::var(WEBHOOK_TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty()),
    })
}

/// What `enqueue` and `requeue` put jobs with: the checked batch size and
/// beanstalkd servers (and tube).
fn queue_options(g: &Global, batch_size: usize) -> Result<(usize, Vec<std::net::SocketAddr>)> {
    let batch_size =
        config::check_range("--batch-size", batch_size, 1, config::MAX_JOB_RECIPIENTS)?;
    let servers = config::parse_beanstalkd(&g.beanstalkd)?;
    config::check_tube(&g.tube)?;
    Ok((batch_size, servers))
}

/// `--max-failure-rate`: `20%`, `0.2` or `off`.
fn parse_failure_rate(raw: &str) -> Result<Option<f64>> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("off") || raw.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let rate = match raw.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().ok().map(|p| p / 100.0),
        None => raw.parse::<f64>().ok(),
    };
    match rate {
        Some(r) if (0.0..=1.0).contains(&r) => Ok(Some(r)),
        _ => Err(UsageError(format!(
            "bad --max-failure-rate {raw:?}: use a percentage (20%), a fraction (0.2) or off"
        ))
        .into()),
    }
}

/// pipe(8)'s "try again later" (sysexits.h EX_TEMPFAIL).
pub const EX_TEMPFAIL: u8 = 75;

/// `mailsplit bounce`. Everything that could succeed later (database down,
/// schema not migrated, unreadable input) exits 75 so Postfix keeps the
/// message: a report is never lost. The message is read before the
/// database is opened, so Postfix's write never meets a closed pipe.
fn cmd_bounce(g: &Global, args: &BounceArgs) -> Result<ExitCode> {
    use crate::bounce::{self, Handled};
    let settings = bounce::Settings {
        soft_limit: config::check_range("--soft-limit", args.soft_limit as usize, 1, 1_000)? as u32,
        soft_window: std::time::Duration::from_secs(
            config::check_range(
                "--soft-window-days",
                args.soft_window_days as usize,
                1,
                3_650,
            )? as u64
                * 86_400,
        ),
    };
    let tempfail = |err: anyhow::Error| {
        let shown = redact::text(&format!("{err:#}"));
        eprintln!("mailsplit: error: {shown}; exit 75: try again later");
        Ok(ExitCode::from(EX_TEMPFAIL))
    };
    let show = |handled: &Handled| match handled {
        Handled::Ignored(why) => tracing::info!("ignored: {why}"),
        Handled::Recorded(events) => {
            for e in events {
                tracing::info!(
                    recipient = %e.email,
                    campaign = ?e.campaign_id,
                    kind = %e.kind,
                    status = e.status.as_deref().unwrap_or("-"),
                    now = e.changed_to.map(|s| s.as_str()).unwrap_or("unchanged"),
                    "{}",
                    if e.new { "recorded" } else { "already recorded" }
                );
            }
        }
    };
    let raw = match &args.maildir {
        Some(_) => None,
        None => match bounce::read_message(std::io::stdin().lock()) {
            Ok(raw) => Some(raw),
            Err(e) => {
                return tempfail(anyhow::Error::from(e).context("cannot read the message on stdin"))
            }
        },
    };
    let mut conn = match open_migrated(g) {
        Ok(conn) => conn,
        Err(e) => return tempfail(e),
    };
    let identity = match store::installation::load(&mut conn) {
        Ok(i) => crate::tokens::Identity::from(&i),
        Err(e) => return tempfail(e.into()),
    };
    match (raw, &args.maildir) {
        (Some(raw), _) => {
            match bounce::handle(
                &mut conn,
                &identity,
                &raw,
                args.recipient.as_deref(),
                &settings,
            ) {
                Ok(handled) => show(&handled),
                Err(e) => return tempfail(e.into()),
            }
        }
        (None, Some(dir)) => {
            let summary = bounce::maildir(&mut conn, &identity, dir, &settings, |path, handled| {
                tracing::debug!(file = %path.display(), "handled");
                show(handled);
            });
            match summary {
                Ok(s) => println!(
                    "{}: {} reports recorded, {} messages ignored",
                    dir.display(),
                    s.recorded,
                    s.ignored
                ),
                Err(e) => return tempfail(e.into()),
            }
        }
        (None, None) => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Smaller lists get more urgent priorities (lower numbers), so a small
/// campaign's jobs are not stuck behind a big one's: 100 for a handful of
/// recipients, 300 for a million.
pub fn default_priority(list_size: i64) -> i64 {
    let bits = 64 - (list_size.max(1) as u64).leading_zeros() as i64;
    100 + 10 * bits
}

fn open(g: &Global) -> Result<Conn> {
    Ok(Conn::open(&g.database_url)?)
}

/// Open, and fail with "run `mailsplit migrate`" when the schema is missing.
fn open_migrated(g: &Global) -> Result<Conn> {
    Ok(store::open_migrated(&g.database_url)?)
}

/// [`open_migrated`] for commands that only read.
fn open_read_only(g: &Global) -> Result<Conn> {
    Ok(store::open_read_only(&g.database_url)?)
}

/// A usage error raised at the edge (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Map an error to the documented exit code: 2 for what the user typed,
/// 1 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        let usage = cause.downcast_ref::<UsageError>().is_some()
            || cause.downcast_ref::<config::ConfigError>().is_some()
            || cause
                .downcast_ref::<templates::TemplateError>()
                .is_some_and(|e| matches!(e, templates::TemplateError::Unknown(_)))
            || cause
                .downcast_ref::<compose::ComposeError>()
                .is_some_and(|e| e.is_usage())
            || cause
                .downcast_ref::<store::StoreError>()
                .is_some_and(|e| e.is_usage())
            || cause
                .downcast_ref::<crate::dkim::DkimError>()
                .is_some_and(|e| {
                    matches!(
                        e,
                        crate::dkim::DkimError::BadDomain(_)
                            | crate::dkim::DkimError::BadSelector(_)
                    )
                })
            || cause
                .downcast_ref::<splitter::EnqueueError>()
                .is_some_and(|e| e.is_usage())
            || cause
                .downcast_ref::<crate::requeue::RequeueError>()
                .is_some_and(|e| e.is_usage())
            || cause
                .downcast_ref::<import::ImportError>()
                .is_some_and(|e| e.is_usage());
        if usage {
            return EXIT_USAGE;
        }
    }
    1
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
}
