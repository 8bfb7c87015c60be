//! `mailsplit status`: what a campaign is doing, read from the O(1)
//! counters (never a scan of the ledger).

use serde::Serialize;

use crate::store::deliveries::rate_window_ms;
use crate::store::engagement::{self, Engagement};
use crate::store::rates::{RateGroup, Usage};
use crate::store::{content, now_ms, Campaign, CampaignState, Conn, Counters, StoreError};

/// Each campaign's status with its content version and the recipients
/// sent each version: what `status --json` and the admin API show.
pub fn with_versions(
    conn: &mut Conn,
    rows: &[(Campaign, Counters)],
) -> Result<Vec<CampaignStatus>, StoreError> {
    let ids: Vec<i64> = rows.iter().map(|(c, _)| c.id).collect();
    let current: std::collections::HashMap<i64, i64> =
        content::latest_versions(conn, &ids)?.into_iter().collect();
    let engaged = engagement::counts(conn, &ids)?;
    let warm = crate::store::warmups::list(conn)?;
    rows.iter()
        .map(|(c, counters)| {
            let sent = content::sent_by_version(conn, c.id)?;
            let now = current.get(&c.id).copied().unwrap_or(0);
            let mut status = CampaignStatus::new(c, counters).with_versions(now, &sent);
            status.engagement = engaged.get(&c.id).copied().unwrap_or_default();
            status.hold_to_warmups(&warm);
            if let Some(v) = crate::campaign::ab::view(conn, c.id, &c.subject)? {
                status.ab = AbStatus {
                    winner: Some(v.winner()),
                    variants: Some(v.variants),
                };
            }
            Ok(status)
        })
        .collect()
}

/// What a campaign is doing, as `status` shows it: the stored state with
/// the pause flag and the counters folded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Draft,
    /// `--send-at` is still ahead (enqueued or not): nothing leaves yet.
    Scheduled,
    Enqueuing,
    Sending,
    Paused,
    Done,
    Cancelled,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Draft,
        Phase::Scheduled,
        Phase::Enqueuing,
        Phase::Sending,
        Phase::Paused,
        Phase::Done,
        Phase::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Draft => "draft",
            Phase::Scheduled => "scheduled",
            Phase::Enqueuing => "enqueuing",
            Phase::Sending => "sending",
            Phase::Paused => "paused",
            Phase::Done => "done",
            Phase::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One campaign as `status --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CampaignStatus {
    pub id: i64,
    pub name: String,
    pub state: Phase,
    pub template: String,
    pub priority: i64,
    pub recipients: i64,
    pub enqueued: i64,
    pub jobs: i64,
    pub sent: i64,
    pub failed: i64,
    pub skipped: i64,
    pub pending: i64,
    /// Messages finished per second over the last few seconds; 0 when idle.
    pub rate: f64,
    /// Messages finished per second from the first outcome to the last.
    pub avg_rate: f64,
    /// Seconds until `pending` reaches 0 at the current rate, or later
    /// when a warm-up spreads it over days (see `eta_note`).
    pub eta_seconds: Option<u64>,
    /// Why the ETA is days away: the warm-up that spreads the campaign.
    pub eta_note: Option<String>,
    /// Sent messages that bounced (5.1.x at send time, or reported later).
    pub bounced: i64,
    /// Sent messages that drew a complaint.
    pub complaints: i64,
    /// `complaints / sent` (0 before anything was sent); Gmail and Yahoo
    /// hold senders to [`COMPLAINT_RATE_LIMIT`].
    pub complaint_rate: f64,
    /// Why the workers paused the campaign (auto-pause), while it is paused.
    pub pause_reason: Option<String>,
    /// The newest content version (`campaign edit` adds one; 0: none
    /// stored), and how many recipients were sent each, by version.
    pub content_version: i64,
    pub versions: std::collections::BTreeMap<String, i64>,
    /// When it may start, RFC 3339 UTC (`--send-at`); `None`: as soon as
    /// it is enqueued.
    pub send_at: Option<String>,
    /// Opens, clicks and unsubscribes: `opened`, `clicked`,
    /// `machine_opened`, `unsubscribed` are unique recipients; `opens`,
    /// `machine_opens`, `clicks` totals.
    #[serde(flatten)]
    pub engagement: Engagement,
    /// Its A/B test (`variants`, `winner`), if it has one.
    #[serde(flatten)]
    pub ab: AbStatus,
}

/// A campaign's A/B test in `status --json`: each variant's counts, and
/// the winner's name (`null` until decided).
/// Both are left out for a campaign without a test.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AbStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variants: Option<Vec<crate::campaign::ab::VariantStatus>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub winner: Option<Option<String>>,
}

/// The complaint rate Gmail and Yahoo hold bulk senders to (0.3 %).
pub const COMPLAINT_RATE_LIMIT: f64 = 0.003;

/// The phase `status` shows: the stored state read with the pause flag,
/// whether the start time is still `ahead`, and the recipients `pending`.
fn phase(state: CampaignState, paused: bool, ahead: bool, pending: i64) -> Phase {
    match (state, paused) {
        (CampaignState::Cancelled, _) => Phase::Cancelled,
        (_, true) => Phase::Paused,
        _ if ahead => Phase::Scheduled,
        (CampaignState::Draft, _) => Phase::Draft,
        (CampaignState::Enqueuing, _) => Phase::Enqueuing,
        (CampaignState::Queued, _) if pending <= 0 => Phase::Done,
        (CampaignState::Queued, _) => Phase::Sending,
    }
}

/// How fast a campaign goes, rounded to a tenth as `status` shows it.
#[derive(Debug, PartialEq)]
struct Pace {
    /// Over the last few seconds, while it is sending; 0 otherwise.
    rate: f64,
    /// From the first outcome to the last.
    avg_rate: f64,
    /// Until nothing is pending at `rate`.
    eta_seconds: Option<u64>,
}

impl Pace {
    fn of(counters: &Counters, phase: Phase, now: i64) -> Pace {
        let pending = counters.pending();
        let recent = counters
            .last_at
            .is_some_and(|at| now - at < 2 * rate_window_ms());
        let rate = if recent && phase == Phase::Sending {
            counters.rate
        } else {
            0.0
        };
        let eta_seconds =
            (rate > 0.0 && pending > 0).then(|| (pending as f64 / rate).ceil() as u64);
        let avg_rate = match (counters.first_at, counters.last_at) {
            (Some(first), Some(last)) if last > first => {
                counters.done() as f64 * 1000.0 / (last - first) as f64
            }
            _ => 0.0,
        };
        Pace {
            rate: (rate * 10.0).round() / 10.0,
            avg_rate: (avg_rate * 10.0).round() / 10.0,
            eta_seconds,
        }
    }
}

impl CampaignStatus {
    pub fn new(campaign: &Campaign, counters: &Counters) -> CampaignStatus {
        let now = now_ms();
        let pending = counters.pending();
        let ahead = campaign.send_at.is_some_and(|at| at > now);
        let state = phase(campaign.state, campaign.paused, ahead, pending);
        let Pace {
            rate,
            avg_rate,
            eta_seconds,
        } = Pace::of(counters, state, now);
        CampaignStatus {
            id: campaign.id,
            name: campaign.name.clone(),
            state,
            template: campaign.template.clone(),
            priority: campaign.priority,
            recipients: counters.recipients,
            enqueued: counters.enqueued,
            jobs: counters.jobs,
            sent: counters.sent,
            failed: counters.failed,
            skipped: counters.skipped,
            pending,
            rate,
            avg_rate,
            eta_seconds,
            eta_note: None,
            bounced: counters.bounced,
            complaints: counters.complaints,
            complaint_rate: if counters.sent > 0 {
                counters.complaints as f64 / counters.sent as f64
            } else {
                0.0
            },
            pause_reason: campaign
                .pause_reason
                .clone()
                .filter(|_| state == Phase::Paused),
            content_version: 0,
            versions: Default::default(),
            send_at: campaign
                .send_at
                .map(|at| crate::clock::rfc3339(at, crate::clock::Precision::AsNeeded)),
            engagement: Engagement::default(),
            ab: AbStatus::default(),
        }
    }

    /// A campaign still sending (or paused) whose pending recipients do
    /// not fit in today's allowance of a warm-up: its ETA is when the
    /// warm-up lets the last of them go.
    pub fn hold_to_warmups(&mut self, warm: &[crate::store::warmups::Warmup]) {
        if !matches!(
            self.state,
            Phase::Sending | Phase::Paused | Phase::Enqueuing
        ) {
            return;
        }
        let held = crate::rate::warmup::campaign_eta(warm, &self.name, self.pending, now_ms());
        if let Some((after_ms, note)) = held {
            let secs = (after_ms.max(0) as u64).div_ceil(1000);
            self.eta_seconds = Some(self.eta_seconds.map_or(secs, |s| s.max(secs)));
            self.eta_note = Some(note);
        }
    }

    /// With its content version and the recipients sent each version.
    pub fn with_versions(mut self, current: i64, sent: &[(i64, i64)]) -> CampaignStatus {
        self.content_version = current;
        self.versions = sent.iter().map(|(v, n)| (v.to_string(), *n)).collect();
        self
    }

    /// `content version 2 (sent: v1 40, v2 60)`.
    fn versions_line(&self) -> String {
        let sent: Vec<String> = self
            .versions
            .iter()
            .map(|(v, n)| format!("v{v} {n}"))
            .collect();
        let sent = if sent.is_empty() {
            String::new()
        } else {
            format!(" (sent: {})", sent.join(", "))
        };
        format!("content version {}{sent}", self.content_version)
    }

    /// `opened 40 (52 opens; machine 7)  clicked 12 (15 clicks)  unsubscribed 1`.
    pub fn engagement_line(&self) -> String {
        let e = &self.engagement;
        format!(
            "opened {} ({} opens; machine {})  clicked {} ({} clicks)  unsubscribed {}",
            e.opened, e.opens, e.machine_opened, e.clicked, e.clicks, e.unsubscribed
        )
    }

    /// `complaints 3 (0.15 % of sent; limit 0.3 %)`, flagged above the limit.
    pub fn complaint_line(&self) -> String {
        let over = if self.complaint_rate > COMPLAINT_RATE_LIMIT {
            " OVER THE LIMIT: stop and clean the list"
        } else {
            ""
        };
        format!(
            "bounced {}  complaints {} ({:.2} % of sent; limit {:.1} %{over})",
            self.bounced,
            self.complaints,
            100.0 * self.complaint_rate,
            100.0 * COMPLAINT_RATE_LIMIT
        )
    }

    /// The human-readable block.
    pub fn render(&self) -> String {
        let eta = match self.eta_seconds {
            Some(s) if s >= 86_400 => {
                format!(
                    "{}d{:02}h{:02}m",
                    s / 86_400,
                    s % 86_400 / 3600,
                    s % 3600 / 60
                )
            }
            Some(s) => format!("{}m{:02}s", s / 60, s % 60),
            None => "-".into(),
        };
        let eta = match &self.eta_note {
            Some(note) => format!("{eta} ({note})"),
            None => eta,
        };
        let schedule = match &self.send_at {
            Some(at) if self.state == Phase::Scheduled && self.enqueued == 0 => format!(
                "\n  send at {at} (not enqueued yet: `mailsplit enqueue {}` any time before)",
                self.name
            ),
            Some(at) => format!("\n  send at {at}"),
            None => String::new(),
        };
        let why = match &self.pause_reason {
            Some(reason) => format!(
                " ({reason}; fix the cause, then `mailsplit resume {n}` and `mailsplit requeue {n} --failed`)",
                n = self.name
            ),
            None => String::new(),
        };
        format!(
            "{name} (id {id}): {state}{why}{schedule}\n  recipients {recipients}  enqueued {enqueued} in {jobs} jobs\n  sent {sent}  failed {failed}  skipped {skipped}  pending {pending}\n  {versions}\n  {complaints}\n  {engagement}\n  rate {rate:.1} msg/s (average {avg:.1})  eta {eta}",
            complaints = self.complaint_line(),
            engagement = self.engagement_line(),
            versions = self.versions_line(),
            name = self.name,
            id = self.id,
            state = self.state,
            recipients = self.recipients,
            enqueued = self.enqueued,
            jobs = self.jobs,
            sent = self.sent,
            failed = self.failed,
            skipped = self.skipped,
            pending = self.pending,
            rate = self.rate,
            avg = self.avg_rate,
        )
    }

    /// One line for `campaign list`.
    pub fn line(&self) -> String {
        format!(
            "{:>4}  {:<24} {:<10} {:<13} prio {:<5} {:>9} recipients {:>9} sent {:>7} failed {:>9} pending",
            self.id,
            self.name,
            self.state.as_str(),
            self.template,
            self.priority,
            self.recipients,
            self.sent,
            self.failed,
            self.pending
        )
    }
}

/// One line per rate group: configured rate, observed rate (tokens spent
/// per second by the live workers; tokens granted when no worker reported),
/// and what waits for it: recipients parked in workers and deferred into
/// delayed jobs not due yet.
pub fn rate_line(g: &RateGroup, usage: &[Usage]) -> String {
    let u = usage.iter().find(|u| u.name == g.name);
    let observed = u.map_or_else(|| observed_rate(g), |u| u.spent_rate);
    format!(
        "{:<32} limit {:>11}  burst {:>5}  observed {:>9.1}/s  parked {:>6}  deferred {:>6}  granted {}",
        g.name,
        crate::rate::limiter::show_stored_rate(g.rate),
        crate::rate::limiter::show_stored_burst(g.burst),
        observed,
        u.map_or(0, |u| u.parked),
        u.map_or(0, |u| u.deferred),
        g.leased
    ) + &adapted_note(g)
}

/// `  adapted 150.0/s since 2026-01-02T12:00:01Z (454 Throttling failure: …)` for a
/// group a throttle cut, `  last throttled …` once it recovered fully;
/// nothing for a group never throttled.
fn adapted_note(g: &RateGroup) -> String {
    if g.cut_at == 0 {
        return String::new();
    }
    let when = |ms: i64| crate::clock::rfc3339(ms, crate::clock::Precision::Seconds);
    let reason = g.adapted_reason.as_deref().unwrap_or("throttled");
    if g.factor < 1.0 {
        format!(
            "  adapted {:.1}/s since {} ({reason})",
            g.adapted_rate(),
            when(g.adapted_at)
        )
    } else {
        format!("  last throttled {} ({reason})", when(g.cut_at))
    }
}

/// One relay's shared connection limit and the sessions leased under it.
pub fn connections_line(l: &crate::store::connections::ConnectionLimit) -> String {
    format!(
        "{:<32} connections {:>5}  in use {:>5}",
        l.name, l.connections, l.held
    )
}

/// Usage rows of workers heard from lately (three heartbeats).
pub fn live_usage(conn: &mut crate::store::Conn) -> crate::store::Result<Vec<Usage>> {
    let since = now_ms() - 3 * crate::config::HEARTBEAT.as_millis() as i64;
    crate::store::rates::usage_since(conn, since)
}

/// Tokens per second a group granted lately. The stored figure is
/// refreshed only while tokens are leased, so an idle group shows 0.
pub fn observed_rate(g: &RateGroup) -> f64 {
    let idle = (now_ms() * 1_000 - g.window_at) > 2 * 5_000_000;
    if idle {
        0.0
    } else {
        g.observed
    }
}

/// `unverified reports: N (…)` for `status`: reports that changed nobody
/// because nothing in them is ours (see `crate::bounce::trust`), with the
/// newest few; `None` when there are none.
pub fn unverified_lines(conn: &mut crate::store::Conn) -> crate::store::Result<Option<String>> {
    let (total, newest) = crate::store::unverified::recent(conn, 3)?;
    if total == 0 {
        return Ok(None);
    }
    let mut out = format!(
        "unverified reports: {total} (forged, or about mail that is not ours; they changed nobody)"
    );
    for u in newest {
        out.push_str(&format!(
            "\n  {} ago: {} {} naming {} ({}): {}",
            crate::worker::fleet::ago(now_ms() - u.received_at),
            u.format,
            u.kind.as_deref().unwrap_or("report"),
            u.addresses,
            u.sample,
            u.why
        ));
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests;
