//! `mailsplit campaign create|list` and `mailsplit preview`.

use crate::cli::args::{CampaignCommand, Global};
use crate::cli::exit::UsageError;
use crate::cli::out::{self, error_line, outln};
use crate::compose;
use crate::config;
use crate::status::CampaignStatus;
use crate::store::campaigns::{self, NewCampaign};
use crate::store::{dkim_keys, recipients, Conn};
use crate::templates;

use super::{open_migrated, open_read_only, Result};

/// `campaign create | list`.
pub fn campaign(g: &Global, cmd: CampaignCommand) -> Result {
    match cmd {
        CampaignCommand::Create {
            name,
            list,
            template,
            subject,
            from,
            priority,
            public_url,
            return_path,
            max_failure_rate,
        } => {
            config::check_campaign_name(&name)?;
            templates::check(&template)?;
            let from = compose::parse_from(&from)?;
            let return_path = return_path
                .filter(|r| !r.trim().is_empty())
                .map(|r| compose::parse_return_path(&r))
                .transpose()?;
            let max_failure_rate = parse_failure_rate(&max_failure_rate)?;
            if subject.trim().is_empty() || subject.chars().any(char::is_control) {
                return Err(UsageError("--subject must be one non-empty line".into()).into());
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
            outln!(
                "created campaign {:?} (id {}) for list {:?}: {} recipients, template {}, priority {}",
                campaign.name, campaign.id, list, size, template, priority
            )?;
            deliverability_warnings(&mut conn, &from, public_url.as_deref())?;
        }
        CampaignCommand::List => {
            let mut conn = open_read_only(g)?;
            let all = campaigns::list(&mut conn)?;
            if all.is_empty() {
                outln!("no campaigns yet; create one with `mailsplit campaign create`")?;
            }
            for (campaign, counters) in all {
                outln!("{}", CampaignStatus::new(&campaign, &counters).line())?;
            }
        }
    }
    Ok(())
}

/// The message one recipient of a campaign would get (MIME source).
pub fn preview(g: &Global, campaign: &str, recipient: Option<&str>) -> Result {
    let mut conn = open_read_only(g)?;
    let message = compose::preview(&mut conn, campaign, recipient)?;
    Ok(out::bytes(&message)?)
}

/// What `campaign create` says on stderr when the campaign's mail will
/// miss what large providers require of bulk mail.
fn deliverability_warnings(
    conn: &mut Conn,
    from: &lettre::message::Mailbox,
    public_url: Option<&str>,
) -> Result {
    match public_url {
        Some(url) => outln!("one-click unsubscribe links: {url}/u/TOKEN (serve them with `mailsplit serve`)")?,
        None => error_line(
            "mailsplit: warning: no --public-url (or MAILSPLIT_PUBLIC_URL): the messages will carry no \
             one-click unsubscribe (RFC 8058), which Gmail, Yahoo and Outlook require of bulk mail"
        ),
    }
    let domain = compose::from_domain(from);
    if dkim_keys::for_domain(conn, &domain)?.is_empty() {
        error_line(&format!(
            "mailsplit: warning: {domain} has no DKIM key: the messages go out unsigned, and large \
             providers reject or junk unsigned bulk mail; `mailsplit dkim keygen {domain}` makes one"
        ));
    }
    Ok(())
}

/// `--max-failure-rate`: `20%`, `0.2` or `off`.
fn parse_failure_rate(raw: &str) -> std::result::Result<Option<f64>, UsageError> {
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
        ))),
    }
}

/// Smaller lists get more urgent priorities (lower numbers), so a small
/// campaign's jobs are not stuck behind a big one's: 100 for a handful of
/// recipients, 300 for a million.
pub fn default_priority(list_size: i64) -> i64 {
    let bits = 64 - (list_size.max(1) as u64).leading_zeros() as i64;
    100 + 10 * bits
}
