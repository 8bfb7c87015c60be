//! `GET /metrics`: a [`Snapshot`] in the Prometheus/OpenMetrics text format
//! (crate `prometheus-client`), built afresh on every scrape from the
//! database counters and beanstalkd's tube stats, so it costs
//! O(campaigns + rate groups + workers + servers) and never scans the
//! ledger, and any number of `serve` processes report the same figures.
//!
//! Per campaign (label `campaign`, its name): `mailsplit_recipients`,
//! `mailsplit_messages_total{outcome}` for every entry of [`OUTCOMES`],
//! `mailsplit_bounced_total`, `mailsplit_complaints_total`, and the
//! engagement counters `mailsplit_opened_total`, `_opens_total`,
//! `_machine_opened_total`, `_machine_opens_total`, `_clicked_total`,
//! `_clicks_total`, `_unsubscribed_total` (see [`AFTER_SENDING`]),
//! `mailsplit_messages_pending`, `mailsplit_enqueued_total`,
//! `mailsplit_campaign_state{state}` (1 for the current state, 0 for the
//! others) and `mailsplit_campaign_send_rate` (messages per second lately).
//! Per rate group (label `group`): `mailsplit_rate_group_limit`,
//! `mailsplit_rate_group_burst`, `mailsplit_rate_group_observed` (tokens
//! per second) and `mailsplit_rate_group_granted_total`. Per beanstalkd
//! server (labels `server`, `tube`): `mailsplit_queue_up`,
//! `mailsplit_queue_jobs{state}`, `mailsplit_queue_watching`. The fleet:
//! `mailsplit_workers{state}` and `mailsplit_workers_on_newest_binary`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;
use std::fmt::Error as FmtError;

use super::snapshot::Snapshot;
use crate::campaign::status::{CampaignStatus, Phase};
use crate::worker::fleet::Liveness;

/// Reads one outcome's count from a campaign's status.
type Count = fn(&CampaignStatus) -> i64;

/// The `outcome` values of `mailsplit_messages_total`: one line per
/// outcome the counters keep.
pub const OUTCOMES: &[(&str, Count)] = &[
    ("sent", |c| c.sent),
    ("failed", |c| c.failed),
    ("skipped", |c| c.skipped),
];

/// Counters of sent messages that came back later: each a subset of
/// `outcome="sent"` (so no outcome of its own), one family per line, e.g.
/// `mailsplit_bounced_total{campaign}`.
pub const AFTER_SENDING: &[(&str, &str, Count)] = &[
    (
        "bounced",
        "Sent messages that bounced (at send time, or reported later).",
        |c| c.bounced,
    ),
    ("complaints", "Sent messages that drew a complaint.", |c| {
        c.complaints
    }),
    (
        "opened",
        "Recipients who opened a message (machine opens not counted).",
        |c| c.engagement.opened,
    ),
    ("opens", "Opens (machine opens not counted).", |c| {
        c.engagement.opens
    }),
    (
        "machine_opened",
        "Recipients with a machine open (a mail proxy's prefetch, or within seconds of delivery).",
        |c| c.engagement.machine_opened,
    ),
    ("machine_opens", "Machine opens.", |c| {
        c.engagement.machine_opens
    }),
    ("clicked", "Recipients who clicked a link.", |c| {
        c.engagement.clicked
    }),
    ("clicks", "Clicks on tracked links.", |c| {
        c.engagement.clicks
    }),
    (
        "unsubscribed",
        "Recipients who unsubscribed by the campaign's link.",
        |c| c.engagement.unsubscribed,
    ),
];

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The snapshot as exposition text.
pub fn encode(snapshot: Snapshot) -> Result<String, FmtError> {
    let mut registry = Registry::with_prefix("mailsplit");
    registry.register_collector(Box::new(Scrape(snapshot)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

/// Write one metric family: `samples` are (labels, value) pairs.
fn family<L, M>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), FmtError>
where
    L: prometheus_client::encoding::EncodeLabelSet,
    M: EncodeMetric + TypedMetric,
{
    let mut metric = encoder.encode_descriptor(name, help, None, M::TYPE)?;
    for (labels, value) in samples {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(v: impl Into<f64>) -> ConstGauge<f64> {
    ConstGauge::new(v.into())
}

/// Counters never go below 0, whatever a hand-edited counter row says.
fn counter(v: i64) -> ConstCounter<u64> {
    ConstCounter::new(v.max(0) as u64)
}

/// One scrape's figures, handed to the registry.
#[derive(Debug)]
struct Scrape(Snapshot);

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), FmtError> {
        let s = &self.0;
        campaign_families(&mut e, s)?;
        rate_group_families(&mut e, s)?;
        queue_families(&mut e, s)?;
        fleet_families(&mut e, s)?;
        family(
            &mut e,
            "tracking_unrecorded",
            "Opens and clicks this serve could not queue for recording (the writer was behind).",
            [(Vec::<(&str, String)>::new(), counter(s.unrecorded as i64))],
        )?;
        Ok(())
    }
}

/// The per-campaign families: sizes, outcomes, state, send rate.
fn campaign_families(e: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), FmtError> {
    let campaign = |c: &CampaignStatus| vec![("campaign", c.name.clone())];
    family(
        e,
        "recipients",
        "Recipients of the campaign.",
        s.campaigns
            .iter()
            .map(|c| (campaign(c), gauge(c.recipients as f64))),
    )?;
    campaign_breakdowns(e, s)?;
    for (name, help, value) in AFTER_SENDING {
        family(
            e,
            name,
            help,
            s.campaigns.iter().map(|c| (campaign(c), counter(value(c)))),
        )?;
    }
    family(
        e,
        "messages_pending",
        "Recipients without a final outcome yet.",
        s.campaigns
            .iter()
            .map(|c| (campaign(c), gauge(c.pending as f64))),
    )?;
    family(
        e,
        "enqueued",
        "Recipients put into beanstalkd jobs.",
        s.campaigns
            .iter()
            .map(|c| (campaign(c), counter(c.enqueued))),
    )?;
    family(
        e,
        "campaign_send_rate",
        "Messages finished per second over the last few seconds.",
        s.campaigns.iter().map(|c| (campaign(c), gauge(c.rate))),
    )?;
    Ok(())
}

/// The per-campaign families with a second label: outcomes and states.
fn campaign_breakdowns(e: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), FmtError> {
    family(
        e,
        "messages",
        "Recipients with a final outcome, by outcome.",
        s.campaigns.iter().flat_map(|c| {
            OUTCOMES.iter().map(move |(outcome, value)| {
                (
                    vec![
                        ("campaign", c.name.clone()),
                        ("outcome", outcome.to_string()),
                    ],
                    counter(value(c)),
                )
            })
        }),
    )?;
    family(
        e,
        "campaign_state",
        "1 for the campaign's current state, 0 for the others.",
        s.campaigns.iter().flat_map(|c| {
            Phase::ALL.iter().map(move |&p| {
                (
                    vec![
                        ("campaign", c.name.clone()),
                        ("state", p.as_str().to_string()),
                    ],
                    gauge(if c.state == p { 1.0 } else { 0.0 }),
                )
            })
        }),
    )?;
    Ok(())
}

/// The rate groups: configured limits and what they granted.
fn rate_group_families(e: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), FmtError> {
    let group = |name: &str| vec![("group", name.to_string())];
    family(
        e,
        "rate_group_limit",
        "Configured tokens per second of the rate group.",
        s.rates.iter().map(|g| (group(&g.name), gauge(g.limit))),
    )?;
    family(
        e,
        "rate_group_burst",
        "Configured burst (tokens) of the rate group.",
        s.rates
            .iter()
            .map(|g| (group(&g.name), gauge(g.burst as f64))),
    )?;
    family(
        e,
        "rate_group_observed",
        "Tokens per second the rate group granted lately.",
        s.rates.iter().map(|g| (group(&g.name), gauge(g.observed))),
    )?;
    family(
        e,
        "rate_group_granted",
        "Tokens the rate group has granted.",
        s.rates.iter().map(|g| (group(&g.name), counter(g.granted))),
    )?;
    Ok(())
}

/// Each beanstalkd server's tube.
fn queue_families(e: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), FmtError> {
    let server = |q: &super::snapshot::QueueView| {
        vec![("server", q.server.to_string()), ("tube", q.tube.clone())]
    };
    family(
        e,
        "queue_up",
        "1 when the beanstalkd server answered this scrape.",
        s.queues
            .iter()
            .map(|q| (server(q), gauge(if q.counts.is_some() { 1.0 } else { 0.0 }))),
    )?;
    family(
        e,
        "queue_jobs",
        "Jobs in the tube on the beanstalkd server, by state.",
        s.queues.iter().flat_map(|q| {
            q.counts.iter().flat_map(move |counts| {
                counts.by_state().map(|(state, n)| {
                    let mut labels = server(q);
                    labels.push(("state", state.to_string()));
                    (labels, gauge(n as f64))
                })
            })
        }),
    )?;
    family(
        e,
        "queue_watching",
        "Connections watching the tube (workers attached).",
        s.queues.iter().flat_map(|q| {
            q.counts
                .iter()
                .map(move |c| (server(q), gauge(c.watching as f64)))
        }),
    )?;
    Ok(())
}

/// The workers, by liveness and binary.
fn fleet_families(e: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), FmtError> {
    family(
        e,
        "workers",
        "Workers by what their heartbeat says; lost = silent too long.",
        Liveness::ALL.iter().map(|&state| {
            (
                vec![("state", state.as_str().to_string())],
                gauge(s.fleet.count(state) as f64),
            )
        }),
    )?;
    let on_newest = gauge(s.fleet.on_newest as f64);
    on_newest.encode(e.encode_descriptor(
        "workers_on_newest_binary",
        "Live workers running the newest binary of the fleet.",
        None,
        ConstGauge::<f64>::TYPE,
    )?)?;
    Ok(())
}
