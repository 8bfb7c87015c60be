//! Time as people and other programs read it: every stored timestamp is
//! milliseconds since the epoch, and every one shown (the CLI's JSON, the
//! reports, the dashboard, webhook events) goes through [`rfc3339`].

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// How much of a second [`rfc3339`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Whole seconds (`…T11:56:34Z`): what a page shows.
    Seconds,
    /// Exactly three decimals (`…T11:56:34.510Z`), so that texts sort as
    /// the times do: webhook events.
    Millis,
    /// Decimals only when there are any (`…T09:00:00.25Z`).
    AsNeeded,
}

/// `ms` since the epoch as RFC 3339 UTC. A time outside what RFC 3339 can
/// spell (beyond the year 9999) is written as `N ms since the epoch`
/// rather than dropped.
pub fn rfc3339(ms: i64, precision: Precision) -> String {
    let nanos = match precision {
        Precision::Seconds | Precision::Millis => i128::from(ms.div_euclid(1000)) * 1_000_000_000,
        Precision::AsNeeded => i128::from(ms) * 1_000_000,
    };
    let Some(text) = OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
    else {
        return format!("{ms} ms since the epoch");
    };
    match (precision, text.strip_suffix('Z')) {
        (Precision::Millis, Some(head)) => {
            format!("{head}.{:03}Z", ms.rem_euclid(1000))
        }
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_precision_writes_what_it_says() {
        let ms = 1_764_158_194_510;
        assert_eq!(rfc3339(ms, Precision::Seconds), "2025-11-26T11:56:34Z");
        assert_eq!(rfc3339(ms, Precision::Millis), "2025-11-26T11:56:34.510Z");
        assert_eq!(rfc3339(ms, Precision::AsNeeded), "2025-11-26T11:56:34.51Z");
        let whole = 1_764_158_194_000;
        assert_eq!(
            rfc3339(whole, Precision::Millis),
            "2025-11-26T11:56:34.000Z"
        );
        assert_eq!(rfc3339(whole, Precision::AsNeeded), "2025-11-26T11:56:34Z");
        assert_eq!(rfc3339(0, Precision::Seconds), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(-1, Precision::Seconds), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn a_time_beyond_rfc3339_is_written_not_dropped() {
        let far = i64::MAX / 2;
        assert_eq!(
            rfc3339(far, Precision::Millis),
            format!("{far} ms since the epoch")
        );
    }
}

/// Units of a span as people type them (`90s`, `30m`, `12h`, `180d`), in ms.
const SPAN_UNITS: [(&str, i64); 4] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
];

/// Parse a span `N` + `s`, `m`, `h` or `d` (`180d`, `2s`, `1.5h`) into
/// milliseconds; `None` for anything else, a span under 1 ms, or one
/// beyond 100 years.
pub fn parse_span(text: &str) -> Option<i64> {
    let t = text.trim();
    let (unit, per) = SPAN_UNITS.iter().find(|(u, _)| t.ends_with(u))?;
    let n: f64 = t.strip_suffix(unit)?.trim().parse().ok()?;
    let ms = n * *per as f64;
    (1.0..=100.0 * 365.0 * 86_400_000.0)
        .contains(&ms)
        .then(|| ms.round() as i64)
}

/// A span in the largest unit that spells it whole (`1d`, `2s`, `90m`),
/// else in ms (`1500ms`).
pub fn show_span(ms: i64) -> String {
    for (unit, per) in SPAN_UNITS {
        if ms >= per && ms % per == 0 {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod span_tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(parse_span("180d"), Some(180 * 86_400_000));
        assert_eq!(parse_span("2s"), Some(2_000));
        assert_eq!(parse_span("1.5h"), Some(5_400_000));
        assert_eq!(parse_span("90m"), Some(5_400_000));
        for bad in ["", "d", "0d", "-1d", "3w", "1e30d", "NaNs"] {
            assert_eq!(parse_span(bad), None, "{bad}");
        }
        assert_eq!(show_span(86_400_000), "1d");
        assert_eq!(show_span(5_400_000), "90m");
        assert_eq!(show_span(1_500), "1500ms");
    }
}
