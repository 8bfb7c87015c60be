//! `campaign test NAME --to ADDR[,ADDR…] [--recipient EMAIL]`: real
//! messages now, through the relay the workers use, rendered for one list
//! member (default: the first active one) exactly as the worker renders
//! them, subject `[TEST] …`. Nothing is written to the ledger or the
//! counters.

use std::time::Duration;

use crate::compose::sample::sample;
use crate::compose::{self, CampaignMail, Unsendable};
use crate::config::SmtpUrl;
use crate::mail::reply::Verdict;
use crate::mail::session::Relay;
use crate::store::{campaigns, installation, Conn};
use crate::tokens::Identity;

use super::CampaignError;

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
            // why: a session that broke (a timeout, a lost connection) is
            // in an unknown state: the next address gets a new one
            if session.has_broken() {
                match relay.connect().await {
                    Ok(fresh) => session = fresh,
                    Err(e) => {
                        outcomes.push((address.clone(), Err(format!("{e:#}"))));
                        continue;
                    }
                }
            }
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
