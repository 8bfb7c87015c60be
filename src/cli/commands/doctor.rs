//! `mailsplit doctor DOMAIN`: the sending domain's DNS, one line a check.

use std::net::IpAddr;
use std::process::ExitCode;

use crate::cli::args::{DoctorArgs, Global};
use crate::cli::exit::UsageError;
use crate::cli::out::outln;
use crate::config::SmtpUrl;
use crate::doctor::{self, DoctorError, Settings, Verdict};

use super::{open_read_only, Result};

/// Print every check; exit 1 when one failed.
pub fn doctor(g: &Global, args: &DoctorArgs) -> Result<ExitCode> {
    let resolver = args
        .resolver
        .as_deref()
        .map(crate::config::parse_resolver)
        .transpose()?;
    let relay_ip = SmtpUrl::parse(&args.smtp)?
        .host
        .trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .ok();
    let settings = Settings {
        domain: args.domain.clone(),
        resolver,
        return_path: args.return_path.clone(),
        public_url: args.public_url.clone(),
        relay_ip,
    };
    let checks = doctor::run(&mut open_read_only(g)?, &settings).map_err(|e| match e {
        DoctorError::Store(e) => e.into(),
        e => crate::cli::CliError::from(UsageError(e.to_string())),
    })?;
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    for c in &checks {
        outln!("{c}")?;
    }
    if failed > 0 {
        outln!("{failed} check(s) failed: fix them before the first send, then run `mailsplit doctor {}` again", args.domain)?;
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
