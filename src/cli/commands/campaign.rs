//! `mailsplit campaign create|edit|list` and `mailsplit preview`.

use std::path::PathBuf;

use crate::campaign::{self, ContentSource, CreateRequest, Created};
use crate::cli::args::{CampaignCommand, Global};
use crate::cli::out::{self, error_line, outln};
use crate::compose;

use super::{open_migrated, open_read_only, Result};

/// `campaign create | list`.
pub fn campaign(g: &Global, cmd: CampaignCommand) -> Result {
    match cmd {
        CampaignCommand::Create {
            name,
            list,
            html,
            text,
            markdown,
            template,
            subject,
            from,
            priority,
            public_url,
            return_path,
            max_failure_rate,
            track,
        } => create(
            g,
            CreateRequest {
                name,
                list,
                content: content_source(html, text, markdown, template),
                subject,
                from,
                priority,
                public_url,
                return_path,
                max_failure_rate,
                track,
            },
        ),
        CampaignCommand::Edit {
            name,
            subject,
            html,
            text,
            markdown,
            from,
            track,
        } => edit(
            g,
            &campaign::EditRequest {
                name,
                subject,
                html,
                text,
                markdown,
                from,
                track,
            },
        ),
        CampaignCommand::List => list(g),
        CampaignCommand::Test(a) => test(g, &a.name, &a.to, a.recipient.as_deref(), &a.smtp),
        CampaignCommand::Delete { name } => {
            let deleted = campaign::delete(&mut open_migrated(g)?, &name)?;
            Ok(outln!("deleted campaign {deleted:?}")?)
        }
    }
}

/// The one content option clap let through.
fn content_source(
    html: Option<PathBuf>,
    text: Option<PathBuf>,
    markdown: Option<PathBuf>,
    template: Option<String>,
) -> ContentSource {
    match (html, markdown, template) {
        (Some(html), _, _) => ContentSource::Html { html, text },
        (_, Some(md), _) => ContentSource::Markdown(md),
        (_, _, name) => ContentSource::Template(name.unwrap_or_default()),
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

/// `campaign edit`: store the new version and say which it is.
fn edit(g: &Global, request: &campaign::EditRequest) -> Result {
    let edited = campaign::edit::edit(&mut open_migrated(g)?, request)?;
    for warning in &edited.warnings {
        error_line(&format!("mailsplit: warning: {warning}"));
    }
    outln!(
        "campaign {:?} now has content version {}; workers send it from the first message after `mailsplit resume`",
        edited.name,
        edited.version
    )?;
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
pub fn preview(g: &Global, campaign: &str, recipient: Option<&str>) -> Result {
    let mut conn = open_read_only(g)?;
    let message = compose::preview(&mut conn, campaign, recipient)?;
    Ok(out::bytes(&message)?)
}
