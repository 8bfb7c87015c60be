//! `mailsplit rate set|list|warmup|delete`.

use crate::cli::args::{Global, RateCommand, WarmupArgs};
use crate::cli::out::outln;
use crate::rate::warmup::{self, WarmupRequest};
use crate::rate::{self, LimitError, SetRequest};

use super::{open_migrated, open_read_only, Result};

/// `rate set | list | delete`.
pub fn rate(g: &Global, cmd: RateCommand) -> Result {
    match cmd {
        RateCommand::Set {
            group,
            rate,
            burst,
            connections,
        } => set(
            g,
            &SetRequest {
                group: &group,
                rate: &rate,
                burst,
                connections,
            },
        ),
        RateCommand::List => list(g),
        RateCommand::Warmup(args) => warm(g, args),
        RateCommand::Delete { group } => {
            rate::delete(&mut open_migrated(g)?, &group)?;
            outln!("rate group {group} deleted")?;
            Ok(())
        }
    }
}

/// Create or change a group and its connection limit; both are stored
/// before anything is printed.
fn set(g: &Global, req: &SetRequest<'_>) -> Result {
    let set = rate::check(req)?;
    rate::set(&mut open_migrated(g)?, &set)?;
    let group = &set.group;
    outln!(
        "rate group {group}: {}, burst {}; workers pick it up within 2 s",
        crate::rate::limiter::show_rate(set.per_second),
        set.burst
    )?;
    match set.connections {
        Some(0) => outln!("connection limit of {group} removed")?,
        Some(n) => outln!("connection limit of {group}: {n} sessions across all workers")?,
        None => {}
    }
    Ok(())
}

/// The groups with their configured and observed rates, then the
/// connection limits.
fn list(g: &Global) -> Result {
    let all = rate::overview(&mut open_read_only(g)?)?;
    if all.rates.is_empty() {
        outln!("no rate groups; add one with `mailsplit rate set GROUP N/s`")?;
    }
    for line in all.rates.iter().chain(&all.connections) {
        outln!("{line}")?;
    }
    Ok(())
}

/// `rate warmup GROUP --start R [--factor F] [--every D] --until R`, or
/// `rate warmup GROUP --off`.
fn warm(g: &Global, args: WarmupArgs) -> Result {
    if args.off {
        warmup::off(&mut open_migrated(g)?, &args.group)?;
        outln!("warm-up of {} ended; the group keeps its rate", args.group)?;
        return Ok(());
    }
    let (Some(start), Some(until)) = (args.start.as_deref(), args.until.as_deref()) else {
        return Err(LimitError::Bad("give --start and --until, or --off".into()).into());
    };
    let checked = warmup::check(&WarmupRequest {
        group: &args.group,
        start,
        factor: args.factor,
        every: &args.every,
        until,
    })?;
    warmup::set(&mut open_migrated(g)?, &checked)?;
    outln!(
        "rate group {}: warm-up from now, {}; workers pick it up within 2 s; `mailsplit rate list` shows each day's allowance",
        checked.group,
        warmup::describe(&checked.schedule)
    )?;
    Ok(())
}
