//! `mailsplit report`: what became of one campaign, from GROUP BYs over its
//! ledger rows ([`crate::store::report`]): outcomes by recipient domain
//! (the top N, the rest as `other`), the top bounce reasons (enhanced
//! status code and text), unsubscribes and complaints, content versions
//! with their counts, and the finished outcomes per minute.
//!
//! The JSON's `tracking` member is `null` when no content version of the
//! campaign tracks opens or clicks; else it has the engagement counters
//! (unique recipients and totals, O(1)) and the clicks on each link.

use std::collections::BTreeMap;

use crate::clock::{rfc3339, Precision};
use serde::Serialize;

use crate::campaign::status::CampaignStatus;
use crate::store::engagement::{self, Engagement};
use crate::store::report::{self as q, ReasonRow};
use crate::store::{campaigns, content, template_links, Conn, StoreError};

/// Distinct failure texts read from the ledger before grouping them by
/// code and text (addresses taken out).
const REPLIES_READ: i64 = 500;
/// Bounce reasons shown.
pub const TOP_REASONS: usize = 10;

/// The whole report, as `report --json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub status: CampaignStatus,
    /// Recipients who left by this campaign's one-click link, as the
    /// domains' rows add up (the text report's total; in JSON the status'
    /// own `unsubscribed` says it, so the key is not printed twice).
    #[serde(skip)]
    pub unsubscribed: i64,
    pub domains: Vec<DomainOutcomes>,
    pub bounce_reasons: Vec<Reason>,
    /// Why recipients were skipped (unsubscribed, bounced, suppressed
    /// with the suppression's reason), most frequent first.
    pub skipped_reasons: Vec<SkipReason>,
    /// Recipients sent each content version, oldest version first.
    pub versions_sent: Vec<VersionSent>,
    /// Finished outcomes per minute, oldest first (minutes without any
    /// are left out).
    pub rate_per_minute: Vec<Minute>,
    /// Opens and clicks per link: `null` when the campaign tracks neither.
    pub tracking: Option<Activity>,
    /// Its A/B test: each variant's rate with a 95 % interval; `null`
    /// without one.
    pub ab: Option<crate::campaign::ab::AbReport>,
}

/// What readers did, for a campaign that tracks opens or clicks.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Activity {
    /// What its versions track: `opens,clicks`, `opens` or `clicks`.
    pub tracks: String,
    /// `opened`, `machine_opened`, `clicked`, `unsubscribed`: unique
    /// recipients; `opens`, `machine_opens`, `clicks`: totals.
    #[serde(flatten)]
    pub counts: Engagement,
    /// Clicks on each link of each tracked version, link 1 first (every
    /// click: unique clickers are kept per campaign, not per link).
    pub links: Vec<LinkClicks>,
    /// Clicks on links the template wrote (`href="{{ p.url }}"`), by the
    /// URL the render produced: the [`TEMPLATE_LINKS_LISTED`] most clicked.
    pub template_links: Vec<TemplateLinkClicks>,
    /// How many distinct template-written URLs were clicked in all.
    pub template_urls_clicked: i64,
}

/// Template-written URLs a report lists at most: one per product and
/// recipient can make many, and the most clicked are what a shop reads.
pub const TEMPLATE_LINKS_LISTED: i64 = 50;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TemplateLinkClicks {
    pub url: String,
    pub clicks: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LinkClicks {
    pub version: i64,
    /// Link N of the version, as `/c/TOKEN/N` names it.
    pub link: i64,
    pub url: String,
    pub clicks: i64,
}

/// The campaign's recipients at one domain (or `other`), by outcome.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct DomainOutcomes {
    pub domain: String,
    pub recipients: i64,
    pub sent: i64,
    pub failed: i64,
    pub skipped: i64,
    /// Claimed or waiting for a retry.
    pub in_progress: i64,
    pub bounced: i64,
    pub complaints: i64,
    pub unsubscribed: i64,
}

/// One bounce reason: the enhanced status code (or the reply code) and
/// the text, with addresses replaced by `<address>`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Reason {
    pub code: Option<String>,
    pub text: String,
    pub count: i64,
    /// `send`: the relay refused it; `report`: a bounce report came later.
    pub source: &'static str,
}

/// One reason recipients were skipped, and how many.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SkipReason {
    pub reason: String,
    pub count: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VersionSent {
    pub version: i64,
    pub sent: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Minute {
    /// The minute's start, RFC 3339 UTC.
    pub minute: String,
    pub sent: i64,
    pub failed: i64,
}

/// Build the report of the campaign named `name_or_id`, with `top`
/// domains.
pub fn build(conn: &mut Conn, name_or_id: &str, top: usize) -> Result<Report, StoreError> {
    let campaign = campaigns::find(conn, name_or_id)?;
    let counters = campaigns::counters(conn, campaign.id)?;
    // The same object `status --json` prints (content version, versions
    // sent, engagement), so the two never disagree.
    let status = crate::campaign::status::with_versions(conn, &[(campaign.clone(), counters)])?
        .pop()
        .ok_or_else(|| StoreError::UnknownCampaign(name_or_id.to_owned()))?;
    let tracking = tracking(conn, campaign.id)?;
    let ab = crate::campaign::ab::view(conn, campaign.id, &campaign.subject)?
        .map(|v| crate::campaign::ab::report(&v));
    let (domains, unsubscribed) = domains(q::by_domain(conn, campaign.id)?, top);
    let mut reasons = group_reasons(q::failure_replies(conn, campaign.id, REPLIES_READ)?, "send");
    reasons.extend(group_reasons(
        q::reported_bounces(conn, campaign.id, REPLIES_READ)?,
        "report",
    ));
    reasons.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.text.cmp(&b.text)));
    reasons.truncate(TOP_REASONS);
    let versions_sent = content::sent_by_version(conn, campaign.id)?
        .into_iter()
        .map(|(version, sent)| VersionSent { version, sent })
        .collect();
    Ok(Report {
        status,
        unsubscribed,
        domains,
        bounce_reasons: reasons,
        skipped_reasons: q::skip_reasons(conn, campaign.id, TOP_REASONS as i64)?
            .into_iter()
            .map(|r| SkipReason {
                reason: r.reason.unwrap_or_else(|| "skipped".into()),
                count: r.n,
            })
            .collect(),
        versions_sent,
        rate_per_minute: minutes(q::per_minute(conn, campaign.id)?),
        tracking,
        ab,
    })
}

/// The counters and clicks per link; `None` when nothing is tracked.
fn tracking(conn: &mut Conn, campaign: i64) -> Result<Option<Activity>, StoreError> {
    let track = content::tracked(conn, campaign)?;
    if !track.any() {
        return Ok(None);
    }
    let counts = engagement::counts(conn, &[campaign])?
        .remove(&campaign)
        .unwrap_or_default();
    let links = engagement::link_clicks(conn, campaign)?
        .into_iter()
        .map(|(version, link, url, clicks)| LinkClicks {
            version,
            link,
            url,
            clicks,
        })
        .collect();
    let (written, template_urls_clicked) =
        template_links::top(conn, campaign, TEMPLATE_LINKS_LISTED)?;
    let template_links = written
        .into_iter()
        .map(|(url, clicks)| TemplateLinkClicks { url, clicks })
        .collect();
    Ok(Some(Activity {
        tracks: track.to_string(),
        counts,
        links,
        template_links,
        template_urls_clicked,
    }))
}

/// The `top` domains with the most recipients, then `other`; and the
/// campaign's one-click unsubscribes.
fn domains(rows: Vec<q::DomainRow>, top: usize) -> (Vec<DomainOutcomes>, i64) {
    let mut by: BTreeMap<String, DomainOutcomes> = BTreeMap::new();
    let mut unsubscribed = 0;
    for row in rows {
        let d = by
            .entry(row.domain.clone())
            .or_insert_with(|| DomainOutcomes {
                domain: row.domain.clone(),
                ..Default::default()
            });
        d.recipients += row.n;
        match row.state.as_str() {
            "sent" => d.sent += row.n,
            "failed" => d.failed += row.n,
            "skipped" => d.skipped += row.n,
            _ => d.in_progress += row.n,
        }
        d.bounced += row.bounced;
        d.complaints += row.complained;
        d.unsubscribed += row.unsubscribed;
        unsubscribed += row.unsubscribed;
    }
    let mut all: Vec<DomainOutcomes> = by.into_values().collect();
    all.sort_by(|a, b| {
        b.recipients
            .cmp(&a.recipients)
            .then_with(|| a.domain.cmp(&b.domain))
    });
    if all.len() > top {
        let rest = all.split_off(top);
        let mut other = DomainOutcomes {
            domain: "other".to_string(),
            ..Default::default()
        };
        for d in rest {
            other.recipients += d.recipients;
            other.sent += d.sent;
            other.failed += d.failed;
            other.skipped += d.skipped;
            other.in_progress += d.in_progress;
            other.bounced += d.bounced;
            other.complaints += d.complaints;
            other.unsubscribed += d.unsubscribed;
        }
        all.push(other);
    }
    (all, unsubscribed)
}

/// Merge distinct texts that differ only in the address they name.
fn group_reasons(rows: Vec<ReasonRow>, source: &'static str) -> Vec<Reason> {
    let mut by: BTreeMap<(Option<String>, String), i64> = BTreeMap::new();
    for row in rows {
        let (code, text) = split_reply(row.reason.as_deref().unwrap_or(""));
        let code = row.status.filter(|s| !s.is_empty()).or(code);
        *by.entry((code, text)).or_default() += row.n;
    }
    by.into_iter()
        .map(|((code, text), count)| Reason {
            code,
            text,
            count,
            source,
        })
        .collect()
}

/// `550 5.1.1 <ada@x.example>: no such user` → (`5.1.1`, `<address>: no
/// such user`): the enhanced code when there is one, else the reply code.
pub fn split_reply(reply: &str) -> (Option<String>, String) {
    let mut words: Vec<&str> = reply.split_whitespace().collect();
    let mut code = None;
    if words.first().is_some_and(|w| is_code(w, 1)) {
        code = Some(words.remove(0).trim_end_matches('-').to_string());
    }
    if words.first().is_some_and(|w| is_code(w, 3)) {
        code = Some(words.remove(0).to_string());
    }
    let text: Vec<String> = words
        .iter()
        .map(|w| {
            if w.contains('@') {
                let tail = &w[w.trim_end_matches([':', ';', ',', '.']).len()..];
                format!("<address>{tail}")
            } else {
                w.to_string()
            }
        })
        .collect();
    (code, crate::store::clip_line(&text.join(" "), 200))
}

/// `550` (parts = 1) or `5.1.1` (parts = 3).
fn is_code(word: &str, parts: usize) -> bool {
    let word = word.trim_end_matches('-');
    let pieces: Vec<&str> = word.split('.').collect();
    pieces.len() == parts
        && pieces
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
        && (parts == 3 || word.len() == 3)
}

fn minutes(rows: Vec<q::MinuteRow>) -> Vec<Minute> {
    let mut by: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for row in rows {
        let slot = by.entry(row.minute).or_default();
        match row.state.as_str() {
            "sent" => slot.0 += row.n,
            _ => slot.1 += row.n,
        }
    }
    by.into_iter()
        .map(|(minute, (sent, failed))| Minute {
            minute: rfc3339(minute * 60_000, Precision::AsNeeded),
            sent,
            failed,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_split_into_code_and_text() {
        assert_eq!(
            split_reply("550 5.1.1 <ada@x.example>: Recipient address rejected"),
            (
                Some("5.1.1".into()),
                "<address>: Recipient address rejected".into()
            )
        );
        assert_eq!(
            split_reply("554 no thanks"),
            (Some("554".into()), "no thanks".into())
        );
        assert_eq!(split_reply("timeout"), (None, "timeout".into()));
    }

    #[test]
    fn domains_beyond_the_top_are_other() {
        let row = |domain: &str, state: &str, n| q::DomainRow {
            domain: domain.into(),
            state: state.into(),
            n,
            bounced: 0,
            complained: 0,
            unsubscribed: 1,
        };
        let (d, unsub) = domains(
            vec![
                row("a.example", "sent", 5),
                row("b.example", "failed", 3),
                row("c.example", "sent", 1),
                row("a.example", "failed", 1),
            ],
            1,
        );
        assert_eq!(unsub, 4);
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].domain.as_str(), d[0].sent, d[0].failed),
            ("a.example", 5, 1)
        );
        assert_eq!(
            (d[1].domain.as_str(), d[1].recipients, d[1].failed),
            ("other", 4, 3)
        );
    }
}
