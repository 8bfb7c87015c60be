//! `campaign test NAME --to ADDR[,ADDR…] [--recipient EMAIL]`: real
//! messages now, through the relay the workers use, rendered for one list
//! member (default: the first active one) exactly as the worker renders
//! them, subject `[TEST] …`. Nothing is written to the ledger or the
//! counters.

use std::time::Duration;

use crate::compose::{self, CampaignMail, ComposeError, Unsendable};
use crate::config::SmtpUrl;
use crate::mail::reply::Verdict;
use crate::mail::session::Relay;
use crate::store::{campaigns, installation, recipients, Conn, Recipient, RecipientStatus};
use crate::tokens::Identity;

use super::CampaignError;

/// Pages of list members looked through for an active one.
const PAGE: i64 = 1_000;

/// The member the test is rendered for.
fn sample(conn: &mut Conn, list_id: i64, email: Option<&str>) -> Result<Recipient, ComposeError> {
    if let Some(e) = email {
        let id = recipients::find_by_email(conn, e)?
            .ok_or_else(|| ComposeError::UnknownRecipient(e.to_string()))?;
        return recipients::load(conn, &[id])?
            .pop()
            .ok_or_else(|| ComposeError::UnknownRecipient(e.to_string()));
    }
    let mut after = 0;
    loop {
        let page = recipients::member_page(conn, list_id, after, PAGE)?;
        let Some(&(last, _)) = page.last() else {
            return Err(ComposeError::EmptyList(format!("list {list_id}")));
        };
        if let Some(&(id, _)) = page.iter().find(|(_, s)| *s == RecipientStatus::Active) {
            return recipients::load(conn, &[id])?
                .pop()
                .ok_or_else(|| ComposeError::UnknownRecipient(format!("id {id}")));
        }
        after = last;
    }
}

/// One `--to` address and what the relay said: `Err` holds its refusal.
pub type Outcome = (String, Result<(), String>);

/// Send the test messages; one [`Outcome`] per `--to` address.
pub fn send_test(
    conn: &mut Conn,
    campaign: &str,
    recipient: Option<&str>,
    to: &[String],
    smtp: SmtpUrl,
    timeout: Duration,
) -> Result<Vec<Outcome>, CampaignError> {
    let c = campaigns::find(conn, campaign)?;
    let r = sample(conn, c.list_id, recipient)?;
    let identity = Identity::from(&installation::load(conn)?);
    let mail = CampaignMail::load(conn, &c, &identity)?;
    let mut messages = Vec::new();
    for address in to {
        let m = compose::compose_test(&mail, &r, address.trim()).map_err(|why| {
            CampaignError::Bad(match why {
                Unsendable::Invalid(e) => format!("--to {address:?}: {e}"),
                Unsendable::Inactive(s) => format!("the recipient is {s}"),
            })
        })?;
        messages.push((address.trim().to_string(), m));
    }
    let relay = Relay::new(smtp, timeout).map_err(|e| CampaignError::Bad(format!("{e:#}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CampaignError::Bad(format!("cannot start: {e}")))?;
    runtime.block_on(async {
        let mut session = relay
            .connect()
            .await
            .map_err(|e| CampaignError::Send(format!("{e:#}")))?;
        let mut outcomes = Vec::new();
        for (address, m) in &messages {
            let outcome = match relay.send(&mut session, m).await {
                Verdict::Sent => Ok(()),
                Verdict::Permanent(reply) | Verdict::Transient(reply) => Err(reply.to_string()),
            };
            outcomes.push((address.clone(), outcome));
        }
        session.quit().await;
        Ok(outcomes)
    })
}
