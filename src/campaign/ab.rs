//! A/B tests on campaigns: what `campaign create --variant-subject …
//! --variant-html FILE … --ab-sample P% --ab-wait D --ab-metric
//! opens|clicks` checks (the variants themselves in
//! [`super::variants`]), the
//! `variants`/`winner` that `status --json` shows, and the statistics
//! `report` prints (each variant's rate with a 95 % Wilson interval, and
//! whether the difference is significant). The workers draw the sample,
//! hold back the rest and pick the winner (see `worker::ab`).

use std::path::PathBuf;

use serde::Serialize;

use super::CampaignError;
use crate::store::ab::{self, Metric, NewAb};
use crate::store::{Conn, StoreError};

pub use super::variants::{Main, MAX_VARIANTS};

/// The A/B options of `campaign create`, as typed.
#[derive(Debug, Clone, Default)]
pub struct AbRequest {
    /// `--variant-subject`, repeatable: variants B, C, …
    pub variant_subjects: Vec<String>,
    /// `--variant-html`, repeatable: variants B, C, … (paired with the
    /// subjects in order; a variant without one has A's).
    pub variant_html: Vec<PathBuf>,
    /// `--ab-sample`: `20%` (1 % to 50 %).
    pub sample: Option<String>,
    /// `--ab-wait`: `30m`, `2h`, `1d`.
    pub wait: Option<String>,
    /// `--ab-metric`: `opens` or `clicks`.
    pub metric: Option<String>,
}

impl AbRequest {
    fn any(&self) -> bool {
        !self.variant_subjects.is_empty()
            || !self.variant_html.is_empty()
            || self.sample.is_some()
            || self.wait.is_some()
            || self.metric.is_some()
    }
}

pub(super) fn bad(why: impl Into<String>) -> CampaignError {
    CampaignError::Bad(why.into())
}

/// A checked test: what to store, and what its creator should hear about
/// the variants' content (scripts).
#[derive(Debug, Clone)]
pub struct CheckedAb {
    pub test: NewAb,
    pub warnings: Vec<String>,
}

/// Check the A/B options against what the campaign tracks; `None` when
/// there is no test.
pub fn check(r: &AbRequest, main: &Main) -> Result<Option<CheckedAb>, CampaignError> {
    if !r.any() {
        return Ok(None);
    }
    let (variants, warnings) = super::variants::check(&r.variant_subjects, &r.variant_html, main)?;
    let sample = r.sample.as_deref().ok_or_else(|| {
        bad("variants need --ab-sample: the share of the list that tests them, e.g. --ab-sample 20%")
    })?;
    let sample_permille = parse_sample(sample)?;
    let wait = r.wait.as_deref().ok_or_else(|| {
        bad("an A/B test needs --ab-wait: how long the sample is watched before the winner goes to the rest, e.g. --ab-wait 2h")
    })?;
    let wait_ms = parse_wait(wait)?;
    let metric = parse_metric(r.metric.as_deref().unwrap_or("opens"))?;
    let tracked = match metric {
        Metric::Opens => main.track.opens,
        Metric::Clicks => main.track.clicks,
    };
    if !tracked {
        return Err(bad(format!(
            "--ab-metric {metric} needs --track {metric} (and --public-url): the winner is picked by tracked {metric}"
        )));
    }
    let test = NewAb {
        sample_permille,
        wait_ms,
        metric,
        variants,
    };
    Ok(Some(CheckedAb { test, warnings }))
}

/// `--ab-sample`: `20%` or `20` (percent, 1 to 50, a tenth at most);
/// thousandths of the list.
pub fn parse_sample(raw: &str) -> Result<i64, CampaignError> {
    let t = raw.trim();
    let pct = t.strip_suffix('%').unwrap_or(t).trim().parse::<f64>().ok();
    match pct {
        Some(p) if (1.0..=50.0).contains(&p) => Ok((p * 10.0).round() as i64),
        _ => Err(bad(format!(
            "bad --ab-sample {raw:?}: use a percentage from 1% to 50%, e.g. 20% (the rest get the winner)"
        ))),
    }
}

/// `--ab-wait`: a number and `s`, `m`, `h` or `d` (at least a second, at
/// most 30 days); milliseconds.
pub fn parse_wait(raw: &str) -> Result<i64, CampaignError> {
    match crate::flows::parse_delay(raw) {
        Some(ms) if (1_000..=30 * 86_400_000).contains(&ms) => Ok(ms),
        _ => Err(bad(format!(
            "bad --ab-wait {raw:?}: use a number with s, m, h or d (e.g. 90m, 2h, 1d), from 1s to 30d"
        ))),
    }
}

/// `--ab-metric`: `opens` or `clicks`.
pub fn parse_metric(raw: &str) -> Result<Metric, CampaignError> {
    raw.trim()
        .to_ascii_lowercase()
        .parse()
        .map_err(|_| bad(format!("bad --ab-metric {raw:?}: use opens or clicks")))
}

pub use crate::store::ab::variant_name;

/// One variant as `status --json` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct VariantStatus {
    pub name: String,
    pub subject: String,
    pub sent: i64,
    /// Unique recipients.
    pub opened: i64,
    pub clicked: i64,
}

/// A campaign's test as `status` and `report` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct AbView {
    pub test: ab::AbTest,
    pub variants: Vec<VariantStatus>,
}

impl AbView {
    /// The winner's name, once decided.
    pub fn winner(&self) -> Option<String> {
        self.test.winner.map(variant_name)
    }
}

/// The campaign's test with each variant's counts; `None` if it has none.
/// `subject`: variant A's (the campaign's current subject).
pub fn view(
    conn: &mut Conn,
    campaign_id: i64,
    subject: &str,
) -> Result<Option<AbView>, StoreError> {
    let Some(test) = ab::get(conn, campaign_id)? else {
        return Ok(None);
    };
    let mut subjects = vec![subject.to_string()];
    subjects.extend(
        ab::variants(conn, campaign_id)?
            .into_iter()
            .map(|v| v.subject.unwrap_or_else(|| subject.to_string())),
    );
    let tallies = ab::tallies(conn, campaign_id, subjects.len() as i64)?;
    let variants = subjects
        .into_iter()
        .zip(tallies)
        .map(|(subject, t)| VariantStatus {
            name: variant_name(t.variant),
            subject,
            sent: t.sent,
            opened: t.opened,
            clicked: t.clicked,
        })
        .collect();
    Ok(Some(AbView { test, variants }))
}

/// A campaign's test as `report` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AbReport {
    /// `opens` or `clicks`.
    pub metric: String,
    pub sample_percent: f64,
    pub wait_seconds: i64,
    /// `null` until decided.
    pub winner: Option<String>,
    pub variants: Vec<VariantRate>,
    /// Whether the best variant's rate differs from the runner-up's at
    /// the 95 % level (two-proportion z test).
    pub significant: bool,
    /// One line on what the numbers say.
    pub verdict: String,
}

/// One variant's rate with its 95 % Wilson interval (fractions of 1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantRate {
    pub name: String,
    pub subject: String,
    pub sent: i64,
    /// Unique recipients who did what the metric counts.
    pub hits: i64,
    pub rate: f64,
    pub low: f64,
    pub high: f64,
}

/// Each variant's rate and interval, and whether the leader's lead means
/// anything.
pub fn report(v: &AbView) -> AbReport {
    let metric = v.test.metric;
    let hits = |s: &VariantStatus| match metric {
        Metric::Opens => s.opened,
        Metric::Clicks => s.clicked,
    };
    let variants: Vec<VariantRate> = v
        .variants
        .iter()
        .map(|s| {
            let (low, high) = wilson(hits(s), s.sent);
            VariantRate {
                name: s.name.clone(),
                subject: s.subject.clone(),
                sent: s.sent,
                hits: hits(s),
                rate: if s.sent > 0 {
                    hits(s) as f64 / s.sent as f64
                } else {
                    0.0
                },
                low,
                high,
            }
        })
        .collect();
    let mut ranked: Vec<&VariantRate> = variants.iter().collect();
    // Best first, A (the earlier) first on a tie: a stable sort.
    ranked.sort_by(|a, b| b.rate.total_cmp(&a.rate));
    let (significant, verdict) = match ranked.as_slice() {
        [best, second, ..] => {
            let sig = significant((best.hits, best.sent), (second.hits, second.sent));
            let line = format!(
                "{} {:.1}% against {} {:.1}% ({metric} per sent message): {}",
                best.name,
                best.rate * 100.0,
                second.name,
                second.rate * 100.0,
                if sig {
                    "the difference is significant at 95%"
                } else {
                    "the difference is not significant at 95% (it may be chance; a larger sample would tell)"
                }
            );
            (sig, line)
        }
        _ => (false, "one variant only".to_string()),
    };
    AbReport {
        metric: metric.to_string(),
        sample_percent: v.test.sample_permille as f64 / 10.0,
        wait_seconds: v.test.wait_ms / 1000,
        winner: v.winner(),
        variants,
        significant,
        verdict,
    }
}

/// z for a two-sided 95 % interval.
const Z95: f64 = 1.959_963_984_540_054;

/// The Wilson score interval (95 %) of `hits` in `n`: (low, high), both
/// in 0..=1; (0, 1) when nothing was sent.
pub fn wilson(hits: i64, n: i64) -> (f64, f64) {
    if n <= 0 {
        return (0.0, 1.0);
    }
    let (n, p) = (n as f64, hits.clamp(0, n) as f64 / n as f64);
    let z2 = Z95 * Z95;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z95 / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Whether two rates differ at the 95 % level: a pooled two-proportion z
/// test (two-sided). False when either side sent nothing.
pub fn significant((h1, n1): (i64, i64), (h2, n2): (i64, i64)) -> bool {
    if n1 <= 0 || n2 <= 0 {
        return false;
    }
    let (p1, p2) = (h1 as f64 / n1 as f64, h2 as f64 / n2 as f64);
    let pooled = (h1 + h2) as f64 / (n1 + n2) as f64;
    let se = (pooled * (1.0 - pooled) * (1.0 / n1 as f64 + 1.0 / n2 as f64)).sqrt();
    if se == 0.0 {
        return false;
    }
    ((p1 - p2) / se).abs() > Z95
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::content::Track;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 5e-4
    }

    #[test]
    fn wilson_matches_published_values() {
        // Newcombe (1998), table I: 81/263 → 0.2553 to 0.3662.
        let (lo, hi) = wilson(81, 263);
        assert!(close(lo, 0.2553) && close(hi, 0.3662), "{lo} {hi}");
        // 15/148 → 0.0624 to 0.1605.
        let (lo, hi) = wilson(15, 148);
        assert!(close(lo, 0.0624) && close(hi, 0.1605), "{lo} {hi}");
        // 0/20: from 0, not below it (the normal interval would be 0 wide).
        let (lo, hi) = wilson(0, 20);
        assert!(lo == 0.0 && close(hi, 0.1611), "{lo} {hi}");
        let (lo, hi) = wilson(20, 20);
        assert!(close(lo, 0.8389) && hi == 1.0, "{lo} {hi}");
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    #[test]
    fn the_report_says_when_a_lead_means_nothing() {
        let view = |a: (i64, i64), b: (i64, i64)| AbView {
            test: ab::AbTest {
                campaign_id: 1,
                sample_permille: 200,
                wait_ms: 7_200_000,
                metric: Metric::Clicks,
                seed: 1,
                started_at: Some(0),
                winner: Some(1),
                decided_at: Some(1),
            },
            variants: [("A", a), ("B", b)]
                .into_iter()
                .map(|(name, (clicked, sent))| VariantStatus {
                    name: name.into(),
                    subject: format!("Subject {name}"),
                    sent,
                    opened: 0,
                    clicked,
                })
                .collect(),
        };
        let r = report(&view((5, 50), (7, 50)));
        assert!(!r.significant);
        assert!(
            r.verdict.starts_with("B 14.0% against A 10.0%"),
            "{}",
            r.verdict
        );
        assert!(r.verdict.contains("not significant"), "{}", r.verdict);
        assert_eq!(r.winner.as_deref(), Some("B"));
        assert_eq!((r.sample_percent, r.wait_seconds), (20.0, 7200));
        let b = &r.variants[1];
        assert!(b.low < 0.14 && b.high > 0.14 && b.low > 0.0, "{b:?}");
        let r = report(&view((50, 1000), (120, 1000)));
        assert!(r.significant && !r.verdict.contains("not"), "{}", r.verdict);
        // A tie: A is named first.
        let r = report(&view((0, 10), (0, 10)));
        assert!(
            r.verdict.starts_with("A 0.0% against B 0.0%"),
            "{}",
            r.verdict
        );
    }

    #[test]
    fn significance_needs_enough_recipients() {
        // 10 % against 12 % on 100 each: not significant.
        assert!(!significant((10, 100), (12, 100)));
        // The same rates on 10,000 each: significant.
        assert!(significant((1_000, 10_000), (1_200, 10_000)));
        // 5 of 60 against 30 of 60: significant.
        assert!(significant((5, 60), (30, 60)));
        assert!(!significant((0, 0), (5, 10)));
        assert!(!significant((0, 10), (0, 10)));
    }

    #[test]
    fn options_are_checked_with_the_fix_named() {
        let track = Track {
            opens: true,
            clicks: false,
        };
        let main = Main {
            name: "c",
            subject: "A",
            track,
            public_url: Some("https://m.test"),
        };
        let req = |subjects: &[&str], sample: Option<&str>, wait: Option<&str>| AbRequest {
            variant_subjects: subjects.iter().map(|s| s.to_string()).collect(),
            sample: sample.map(str::to_string),
            wait: wait.map(str::to_string),
            ..AbRequest::default()
        };
        assert!(check(&AbRequest::default(), &main).unwrap().is_none());
        let e = check(&req(&[], Some("20%"), Some("2h")), &main).unwrap_err();
        assert!(e.to_string().contains("--variant-subject"), "{e}");
        assert!(e.to_string().contains("--variant-html"), "{e}");
        let e = check(&req(&["B"], None, Some("2h")), &main).unwrap_err();
        assert!(e.to_string().contains("--ab-sample 20%"), "{e}");
        for bad in ["0%", "60%", "51", "x", "-5%"] {
            let e = check(&req(&["B"], Some(bad), Some("2h")), &main).unwrap_err();
            assert!(e.to_string().contains("1% to 50%"), "{bad}: {e}");
        }
        for bad in ["2", "2w", "0", "0s", "h"] {
            let e = check(&req(&["B"], Some("20%"), Some(bad)), &main).unwrap_err();
            assert!(e.to_string().contains("s, m, h or d"), "{bad}: {e}");
        }
        let ok = check(&req(&["B", "C"], Some("12.5%"), Some("90m")), &main)
            .unwrap()
            .unwrap()
            .test;
        assert_eq!((ok.sample_permille, ok.wait_ms), (125, 90 * 60_000));
        assert_eq!(ok.metric, Metric::Opens);
        assert_eq!(ok.variants[1].subject.as_deref(), Some("C"));
        assert!(ok.variants[1].content.is_none());
        let mut clicks = req(&["B"], Some("20%"), Some("2h"));
        clicks.metric = Some("clicks".into());
        let e = check(&clicks, &main).unwrap_err();
        assert!(e.to_string().contains("--track clicks"), "{e}");
        let e = check(&req(&["{{ x"], Some("20%"), Some("2h")), &main).unwrap_err();
        assert!(e.to_string().contains("--variant-subject"), "{e}");
        let ten: Vec<String> = (0..10).map(|i| format!("S{i}")).collect();
        let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
        let e = check(&req(&ten, Some("20%"), Some("2h")), &main).unwrap_err();
        assert!(e.to_string().contains("at most 9"), "{e}");
    }
}
