//! `mailsplit campaign create|edit|list` and `mailsplit preview`.

use crate::campaign::{self, CreateRequest, Created};
use crate::cli::args::{CampaignCommand, Global};
use crate::cli::out::{self, error_line, outln};
use crate::compose;

use super::{open_migrated, open_read_only, Result};

/// `campaign create | list`.
pub fn campaign(g: &Global, cmd: CampaignCommand) -> Result {
    match cmd {
        CampaignCommand::Create(a) => create(g, a.request()),
        CampaignCommand::Edit(a) => edit(g, &a.request()),
        CampaignCommand::List => list(g),
        CampaignCommand::Test(a) => test(g, &a.name, &a.to, a.recipient.as_deref(), &a.smtp),
        CampaignCommand::Delete { name } => {
            let deleted = campaign::delete(&mut open_migrated(g)?, &name)?;
            Ok(outln!("deleted campaign {deleted:?}")?)
        }
    }
}

/// Check, create, and say what large providers will miss.
fn create(g: &Global, request: CreateRequest) -> Result {
    let checked = campaign::check(request)?;
    let created = campaign::create(&mut open_migrated(g)?, checked)?;
    for warning in &created.warnings {
        error_line(&format!("mailsplit: warning: {warning}"));
    }
    print_created(&created)
}

fn print_created(c: &Created) -> Result {
    outln!(
        "created campaign {:?} (id {}) for list {:?}: {} recipients, content {}, priority {}",
        c.campaign.name,
        c.campaign.id,
        c.list,
        c.recipients,
        c.template,
        c.priority
    )?;
    if let Some(at) = c.campaign.send_at {
        outln!(
            "scheduled: no message leaves before {} (`mailsplit enqueue {}` any time before)",
            crate::clock::rfc3339(at, crate::clock::Precision::AsNeeded),
            c.campaign.name
        )?;
    }
    if let Some(ab) = &c.ab {
        outln!(
            "A/B test: {} variants to a random {}% of the list; {}s after the first send the best by {} goes to the rest (`mailsplit status {}` shows the winner)",
            ab.variants.len() + 1,
            ab.sample_permille as f64 / 10.0,
            ab.wait_ms / 1000,
            ab.metric,
            c.campaign.name
        )?;
    }
    if let Some(url) = &c.public_url {
        outln!("one-click unsubscribe links: {url}/u/TOKEN (serve them with `mailsplit serve`)")?;
    }
    if c.track.any() {
        outln!(
            "tracking {} ({} links numbered for clicks)",
            c.track,
            c.links
        )?;
    }
    Ok(())
}

/// `campaign edit`: store the new version and/or start time and say what
/// changed; a start moved earlier makes the jobs delayed for the old one
/// ready now (workers delay them again by what is left of the new wait).
fn edit(g: &Global, request: &campaign::EditRequest) -> Result {
    let servers = crate::config::parse_beanstalkd(&g.beanstalkd)?;
    let mut conn = open_migrated(g)?;
    let edited = campaign::edit::edit(&mut conn, request)?;
    for warning in &edited.warnings {
        error_line(&format!("mailsplit: warning: {warning}"));
    }
    if let Some(version) = edited.version {
        outln!(
            "campaign {:?} now has content version {version}; workers send it from the first message after `mailsplit resume` or the start",
            edited.name,
        )?;
    }
    match edited.send_at {
        Some(Some(at)) => outln!(
            "campaign {:?} now starts at {}",
            edited.name,
            crate::clock::rfc3339(at, crate::clock::Precision::AsNeeded)
        )?,
        Some(None) => outln!(
            "campaign {:?} is no longer scheduled: it sends as soon as it is enqueued",
            edited.name
        )?,
        None => {}
    }
    if edited.earlier {
        for (server, kicked) in crate::campaign::control::kick_delayed(&mut conn, &servers, &g.tube)
        {
            if let Err(e) = kicked {
                error_line(&format!(
                    "mailsplit: warning: cannot make the delayed jobs on {server} ready ({e}); they come at the old time, at most an hour late"
                ));
            }
        }
    }
    Ok(())
}

/// `campaign test`: one line per address; exit 1 if any was refused.
fn test(g: &Global, name: &str, to: &[String], recipient: Option<&str>, smtp: &str) -> Result {
    let url = crate::config::SmtpUrl::parse(smtp)?;
    let mut conn = open_read_only(g)?;
    let outcomes = campaign::test_send::send_test(
        &mut conn,
        name,
        recipient,
        to,
        url,
        crate::config::DEFAULT_SMTP_TIMEOUT,
    )?;
    let mut refused = Vec::new();
    for (address, outcome) in outcomes {
        match outcome {
            Ok(()) => outln!("sent a test message to {address}")?,
            Err(reply) => refused.push(format!("{address}: {reply}")),
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(campaign::CampaignError::Send(refused.join("; ")).into())
}

/// One line per campaign.
fn list(g: &Global) -> Result {
    let all = campaign::statuses(&mut open_read_only(g)?, None)?;
    if all.is_empty() {
        outln!("no campaigns yet; create one with `mailsplit campaign create`")?;
    }
    for status in all {
        outln!("{}", status.line())?;
    }
    Ok(())
}

/// The message one recipient of a campaign would get (MIME source).
pub fn preview(g: &Global, campaign: &str, recipient: Option<&str>, real_links: bool) -> Result {
    let mut conn = open_read_only(g)?;
    let message = compose::preview(&mut conn, campaign, recipient, real_links)?;
    Ok(out::bytes(&message)?)
}
