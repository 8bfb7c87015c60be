//! Bar charts of counts over time, drawn server-side as inline SVG: no
//! script, no external asset, nothing a Content-Security-Policy without
//! `script-src` would block. Each series becomes its own [`Figure`] (its
//! own scale: a few failures stay visible next to thousands sent), with a
//! caption, a one-sentence summary for `aria-label` and the data as rows
//! for a table, so the chart reads without sight. More series (opens,
//! clicks) are more entries in the slice given to [`figures`].
//!
//! The SVG is built here as text: every number is formatted from an
//! integer or float, every word goes through [`escape`], so the markup is
//! safe to put in the page unescaped.

use std::fmt::Write as _;

use time::OffsetDateTime;

/// One series: a count per bucket.
pub struct Series<'a> {
    /// What is counted, for people: `Sent`.
    pub name: &'a str,
    /// A CSS class (`sent`): the bars' colour; only `[a-z-]` is kept.
    pub class: &'a str,
    pub values: &'a [i64],
}

/// Where the buckets lie in time.
#[derive(Debug, Clone, Copy)]
pub struct Axis {
    /// The first bucket's start, ms since the epoch.
    pub start_ms: i64,
    /// Each bucket's width, ms (at least 1).
    pub bucket_ms: i64,
}

/// One chart, ready for the template.
pub struct Figure {
    pub class: String,
    /// `Sent per minute (UTC)`.
    pub caption: String,
    /// One sentence: the total, the peak and when; also the SVG's label.
    pub summary: String,
    /// The `<svg>` element, safe to insert as it is.
    pub svg: String,
    /// The table's first column heading: `Minute starting (UTC)`.
    pub bucket_heading: String,
    pub rows: Vec<DataRow>,
}

/// One bucket of the data table.
pub struct DataRow {
    /// RFC 3339, for `<time datetime>`.
    pub at: String,
    /// As the axis shows it.
    pub label: String,
    pub count: i64,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 630.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 160.0;

/// A figure per series, all on `axis`.
pub fn figures(axis: Axis, series: &[Series]) -> Vec<Figure> {
    let axis = Axis {
        start_ms: axis.start_ms,
        bucket_ms: axis.bucket_ms.max(1),
    };
    series.iter().map(|s| figure(axis, s)).collect()
}

fn figure(axis: Axis, s: &Series) -> Figure {
    let class: String = s
        .class
        .chars()
        .filter(|c| c.is_ascii_lowercase() || *c == '-')
        .collect();
    let values: Vec<i64> = s.values.iter().map(|v| (*v).max(0)).collect();
    let unit = per(axis.bucket_ms);
    let caption = format!("{} {unit} (UTC)", s.name);
    let summary = summary(axis, s.name, &unit, &values);
    let dated = span_ms(axis, values.len()) >= DAY;
    let rows = values
        .iter()
        .enumerate()
        .map(|(i, &count)| {
            let at = at(axis, i);
            DataRow {
                at: clock(at, true).replace(' ', "T") + ":00Z",
                label: clock(at, dated),
                count,
            }
        })
        .collect();
    Figure {
        svg: svg(axis, &class, s.name, &summary, &values, dated),
        bucket_heading: format!("{} starting (UTC)", bucket_noun(axis.bucket_ms)),
        class,
        caption,
        summary,
        rows,
    }
}

const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

fn at(axis: Axis, i: usize) -> i64 {
    axis.start_ms
        .saturating_add(axis.bucket_ms.saturating_mul(i as i64))
}

fn span_ms(axis: Axis, n: usize) -> i64 {
    axis.bucket_ms.saturating_mul(n as i64)
}

/// `per minute`, `per 5 minutes`, `per hour`, `per 2 days`.
fn per(bucket_ms: i64) -> String {
    let (n, noun) = if bucket_ms % DAY == 0 {
        (bucket_ms / DAY, "day")
    } else if bucket_ms % HOUR == 0 {
        (bucket_ms / HOUR, "hour")
    } else if bucket_ms % MINUTE == 0 {
        (bucket_ms / MINUTE, "minute")
    } else {
        (bucket_ms, "millisecond")
    };
    match n {
        1 => format!("per {noun}"),
        _ => format!("per {n} {noun}s"),
    }
}

fn bucket_noun(bucket_ms: i64) -> String {
    let p = per(bucket_ms);
    let noun = p.trim_start_matches("per ");
    let mut cs = noun.chars();
    match cs.next() {
        Some(c) => c.to_ascii_uppercase().to_string() + cs.as_str(),
        None => String::new(),
    }
}

/// `HH:MM`, or `YYYY-MM-DD HH:MM` when `dated`, UTC.
fn clock(ms: i64, dated: bool) -> String {
    let Ok(t) = OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)) else {
        return format!("{ms} ms");
    };
    let hm = format!("{:02}:{:02}", t.hour(), t.minute());
    if dated {
        format!(
            "{:04}-{:02}-{:02} {hm}",
            t.year(),
            u8::from(t.month()),
            t.day()
        )
    } else {
        hm
    }
}

fn summary(axis: Axis, name: &str, unit: &str, values: &[i64]) -> String {
    let total = values.iter().fold(0i64, |a, v| a.saturating_add(*v));
    let peak = values
        .iter()
        .enumerate()
        .max_by_key(|(i, v)| (**v, std::cmp::Reverse(*i)));
    match peak {
        Some((i, &max)) if total > 0 => {
            let dated = span_ms(axis, values.len()) >= DAY;
            let from = clock(at(axis, 0), dated);
            let to = clock(at(axis, values.len()), dated);
            format!(
                "{name} {unit} from {from} to {to} UTC: {total} in all, at most {max} (from {}).",
                clock(at(axis, i), dated)
            )
        }
        _ => format!("{name} {unit}: none yet."),
    }
}

/// The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k at least
/// `max` (at least 1): a round top for the scale that wastes little.
fn nice_ceiling(max: i64) -> i64 {
    let mut step: i64 = 10;
    loop {
        for m in [10, 12, 15, 20, 25, 30, 40, 50, 60, 80] {
            match step.checked_mul(m) {
                Some(c) if c / 100 >= max => return (c / 100).max(1),
                Some(_) => {}
                None => return max,
            }
        }
        match step.checked_mul(10) {
            Some(s) => step = s,
            None => return max,
        }
    }
}

fn svg(axis: Axis, class: &str, name: &str, label: &str, values: &[i64], dated: bool) -> String {
    let top = nice_ceiling(values.iter().copied().max().unwrap_or(0).max(1));
    let n = values.len().max(1) as f64;
    let slot = (RIGHT - LEFT) / n;
    let gap = if slot > 4.0 { slot * 0.15 } else { 0.0 };
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{}\" \
         data-bucket-ms=\"{}\" data-start-ms=\"{}\">",
        escape(label),
        axis.bucket_ms,
        axis.start_ms
    );
    // Grid and y labels: 0, half, top.
    for value in [0, top / 2, top] {
        let y = BOTTOM - (value as f64 / top as f64) * (BOTTOM - TOP);
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{RIGHT}\" y2=\"{y:.1}\"/>\
             <text class=\"tick y\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value}</text>",
            LEFT - 6.0,
            y + 4.0
        );
    }
    for (i, &v) in values.iter().enumerate().filter(|(_, v)| **v > 0) {
        let h = (v as f64 / top as f64) * (BOTTOM - TOP);
        let x = LEFT + slot * i as f64 + gap / 2.0;
        let start = at(axis, i);
        let _ = write!(
            out,
            "<rect class=\"bar {class}\" x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{h:.2}\" \
             data-start-ms=\"{start}\" data-count=\"{v}\"><title>{}: {v} {}</title></rect>",
            BOTTOM - h,
            (slot - gap).max(0.5),
            clock(start, dated),
            escape(&name.to_lowercase()),
        );
    }
    x_axis(&mut out, axis, values.len(), name, dated);
    out
}

/// The x axis: its line, the first and last bucket edges, its title; the
/// y axis's title; the end of the chart.
fn x_axis(out: &mut String, axis: Axis, buckets: usize, name: &str, dated: bool) {
    let end = at(axis, buckets);
    let _ = write!(
        out,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{BOTTOM}\" x2=\"{RIGHT}\" y2=\"{BOTTOM}\"/>\
         <text class=\"tick x\" x=\"{LEFT}\" y=\"{:.1}\" text-anchor=\"start\">{}</text>\
         <text class=\"tick x\" x=\"{RIGHT}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
         <text class=\"axis-title x\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time (UTC)</text>\
         <text class=\"axis-title y\" transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{} {}</text>\
         </svg>",
        BOTTOM + 16.0,
        clock(axis.start_ms, dated),
        BOTTOM + 16.0,
        clock(end, dated),
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 34.0,
        (TOP + BOTTOM) / 2.0,
        escape(&name.to_lowercase()),
        per(axis.bucket_ms),
    );
}

/// Text made safe for an element or a quoted attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_764_156_000_000; // 2025-11-26 11:20 UTC

    fn one(values: &[i64]) -> Figure {
        let s = Series {
            name: "Sent",
            class: "sent",
            values,
        };
        figures(
            Axis {
                start_ms: T0,
                bucket_ms: MINUTE,
            },
            &[s],
        )
        .remove(0)
    }

    fn counts(svg: &str) -> Vec<i64> {
        svg.split("data-count=\"")
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
            .collect()
    }

    #[test]
    fn no_buckets_draws_axes_and_says_none() {
        let f = one(&[]);
        assert!(f.svg.starts_with("<svg") && f.svg.ends_with("</svg>"));
        assert!(counts(&f.svg).is_empty());
        assert_eq!(f.summary, "Sent per minute: none yet.");
        assert!(f.rows.is_empty());
        assert!(!f.svg.contains("NaN") && !f.svg.contains("inf"));
    }

    #[test]
    fn one_bucket_fills_the_plot() {
        let f = one(&[7]);
        assert_eq!(counts(&f.svg), [7]);
        assert!(!f.svg.contains("NaN") && !f.svg.contains("inf"));
        assert_eq!(
            f.summary,
            "Sent per minute from 11:20 to 11:21 UTC: 7 in all, at most 7 (from 11:20)."
        );
        assert_eq!(f.rows.len(), 1);
        assert_eq!(f.rows[0].at, "2025-11-26T11:20:00Z");
        assert_eq!(f.rows[0].label, "11:20");
        assert_eq!(f.bucket_heading, "Minute starting (UTC)");
    }

    #[test]
    fn only_nonzero_buckets_get_bars_and_they_sum_to_the_total() {
        let f = one(&[0, 3, 0, 400, -5, 1]);
        assert_eq!(counts(&f.svg), [3, 400, 1]);
        assert!(f.summary.contains("404 in all, at most 400 (from 11:23)"));
        assert_eq!(f.rows.iter().map(|r| r.count).sum::<i64>(), 404);
        assert_eq!(f.rows[4].count, 0, "a negative count shows as none");
    }

    #[test]
    fn huge_values_stay_finite_and_in_the_box() {
        let f = one(&[i64::MAX, 1, i64::MAX / 3]);
        assert!(
            !f.svg.contains("NaN") && !f.svg.contains("inf"),
            "{}",
            f.svg
        );
        assert!(f.summary.contains(&format!("{} in all", i64::MAX)));
        for h in f.svg.split(" height=\"").skip(1) {
            let h: f64 = h[..h.find('"').unwrap()].parse().unwrap();
            assert!((0.0..=BOTTOM - TOP + 0.01).contains(&h), "{h}");
        }
        assert_eq!(nice_ceiling(i64::MAX), i64::MAX);
        assert_eq!(nice_ceiling(401), 500);
        assert_eq!(nice_ceiling(105), 120);
        assert_eq!(nice_ceiling(15), 15);
        assert_eq!(nice_ceiling(2), 2);
        assert_eq!(nice_ceiling(1), 1);
    }

    #[test]
    fn hostile_names_and_classes_are_escaped() {
        let s = Series {
            name: "<script>\"'&",
            class: "x\" onload=\"alert(1)",
            values: &[1],
        };
        let f = figures(
            Axis {
                start_ms: i64::MAX,
                bucket_ms: 0,
            },
            &[s],
        )
        .remove(0);
        assert!(!f.svg.contains("<script"), "{}", f.svg);
        assert!(!f.svg.contains("onload=\""), "{}", f.svg);
        assert_eq!(f.class, "xonloadalert");
        assert!(f.svg.contains("&lt;script&gt;&quot;&#39;&amp;"));
    }

    #[test]
    fn units_follow_the_bucket() {
        assert_eq!(per(MINUTE), "per minute");
        assert_eq!(per(5 * MINUTE), "per 5 minutes");
        assert_eq!(per(HOUR), "per hour");
        assert_eq!(per(3 * HOUR), "per 3 hours");
        assert_eq!(per(2 * DAY), "per 2 days");
        assert_eq!(bucket_noun(2 * HOUR), "2 hours");
        let long = figures(
            Axis {
                start_ms: T0,
                bucket_ms: DAY,
            },
            &[Series {
                name: "Failed",
                class: "failed",
                values: &[1, 2],
            }],
        )
        .remove(0);
        assert_eq!(long.rows[1].label, "2025-11-27 11:20");
        assert_eq!(long.caption, "Failed per day (UTC)");
    }
}
