//! The command line, the top floor: [`args`] (what clap parses),
//! [`resolve`] (arguments → settings), [`commands`] (one file per command
//! family, each calling one stage), [`out`] (stdout that a closed pipe
//! cannot crash) and [`exit`] (every error's exit code). `main.rs` only
//! maps the result to an exit code.

pub mod args;
pub mod commands;
#[cfg(test)]
mod docs_check;
pub mod exit;
pub mod out;
pub mod resolve;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use crate::campaign::control::Control;
use crate::redact;

pub use args::{Cli, Command, Global};
pub use exit::{fail, CliError, ExitKind, UsageError, EXIT_USAGE, EX_TEMPFAIL};

use commands as c;

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

/// Run the parsed command line: one call per command.
pub fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let g = &cli.global;
    match cli.command {
        Command::Migrate => c::migrate::migrate(g)?,
        Command::Import(args) => c::import::import(g, &args)?,
        Command::Campaign(cmd) => c::campaign::campaign(g, cmd)?,
        Command::List(cmd) => c::lists::lists(g, cmd)?,
        Command::Optouts { since, format } => {
            c::lists::optouts(g, since.as_deref(), format == args::Format::Json)?
        }
        Command::Templates { command } => c::templates::templates(command)?,
        Command::Enqueue {
            campaign,
            batch_size,
            wait,
        } => c::queue::enqueue(g, &campaign, batch_size, wait)?,
        Command::Worker(args) => c::worker::worker(g, &args)?,
        Command::Serve(args) => c::serve::serve(g, &args)?,
        Command::Preview {
            campaign,
            recipient,
            real_links,
        } => c::campaign::preview(g, &campaign, recipient.as_deref(), real_links)?,
        Command::Rate(cmd) => c::rate::rate(g, cmd)?,
        Command::Dkim(cmd) => c::dkim::dkim(g, cmd)?,
        Command::Doctor(args) => return c::doctor::doctor(g, &args),
        Command::Webhook(cmd) => c::webhook::webhook(g, cmd)?,
        Command::Template(cmd) => c::messages::template(g, cmd)?,
        Command::Send(args) => c::messages::send(g, args)?,
        Command::Message(cmd) => c::messages::message(g, cmd)?,
        Command::Flow(cmd) => c::flow::flow(g, cmd)?,
        Command::Apikey(cmd) => c::apikey::apikey(g, cmd)?,
        Command::Suppress(cmd) => c::people::suppress(g, cmd)?,
        Command::Subscriber(cmd) => c::people::subscriber(g, cmd)?,
        Command::Report {
            campaign,
            json,
            top,
        } => c::report::report(g, &campaign, json, top)?,
        Command::Bounce(args) => return c::bounce::bounce(g, &args),
        Command::Requeue {
            campaign,
            failed,
            batch_size,
        } => c::queue::requeue(g, &campaign, failed, batch_size)?,
        Command::Pause { campaign } => c::control::control(g, &campaign, Control::Pause)?,
        Command::Resume { campaign } => c::control::control(g, &campaign, Control::Resume)?,
        Command::Cancel { campaign } => c::control::control(g, &campaign, Control::Cancel)?,
        Command::Workers { json } => c::status::workers(g, json)?,
        Command::Status { campaign, json } => c::status::status(g, campaign.as_deref(), json)?,
    }
    Ok(ExitCode::SUCCESS)
}
