//! What `rate set` accepts: a group name (a `domain:` group must name a
//! domain), a rate between one a day and [`MAX_RATE`] per second, a burst
//! up to [`MAX_BURST`]; and how a rate is shown (in the unit it was most
//! likely given in, so `1/h` reads `1/h`, never `0.000/s`).

use crate::rate_group::{Group, GroupError};
use crate::store::rates::{self, MAX_BURST, MAX_RATE, MIN_RATE};

/// A checked `rate set`.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// The group (a domain lowercased, as A-labels).
    pub group: Group,
    /// Tokens per second.
    pub per_second: f64,
    pub burst: i64,
}

/// Why `rate set` refuses (each a usage error: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    #[error(transparent)]
    Name(#[from] GroupError),
    #[error("bad rate {0:?}: use N/s, N/m, N/h or N/d, e.g. 200/s")]
    BadRate(String),
    #[error("rate {asked:?} is above the maximum of {}", show_rate(MAX_RATE))]
    TooFast { asked: String },
    #[error("rate {asked:?} is below the minimum of {}", show_rate(MIN_RATE))]
    TooSlow { asked: String },
    #[error("burst {0} is above the maximum of {MAX_BURST}")]
    BurstTooLarge(u32),
    #[error("burst 0 would let nothing through: give at least 1, or leave --burst out")]
    BurstZero,
}

/// Check a `rate set GROUP RATE [--burst N]`. Without a burst, a tenth of
/// a second's worth (at least 1).
pub fn setting(group: &str, rate: &str, burst: Option<u32>) -> Result<Setting, SettingError> {
    let group: Group = group.parse()?;
    let per_second = parse_rate(rate).ok_or_else(|| SettingError::BadRate(rate.to_string()))?;
    // A hair of tolerance: `1/d` is exactly MIN_RATE, `6000000/m` MAX_RATE.
    if per_second > MAX_RATE * (1.0 + 1e-12) {
        return Err(SettingError::TooFast {
            asked: rate.to_string(),
        });
    }
    if per_second < MIN_RATE * (1.0 - 1e-12) {
        return Err(SettingError::TooSlow {
            asked: rate.to_string(),
        });
    }
    let burst = match burst {
        Some(b) if i64::from(b) > MAX_BURST => return Err(SettingError::BurstTooLarge(b)),
        Some(0) => return Err(SettingError::BurstZero),
        Some(b) => i64::from(b),
        None => (per_second / 10.0).ceil().max(1.0) as i64,
    };
    Ok(Setting {
        group,
        per_second,
        burst,
    })
}

/// Units a rate is written in, seconds per unit.
const UNITS: [(&str, f64); 4] = [("s", 1.0), ("m", 60.0), ("h", 3_600.0), ("d", 86_400.0)];

/// Parse `200/s`, `5000/m`, `100000/h`, `10/d` (also `per` words) into
/// tokens per second. Whether it is within bounds is [`setting`]'s check.
pub fn parse_rate(s: &str) -> Option<f64> {
    let (n, unit) = s.trim().split_once('/')?;
    let n: f64 = n.trim().parse().ok()?;
    let per = match unit.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        "h" | "hour" => 3600.0,
        "d" | "day" => 86_400.0,
        _ => return None,
    };
    (n > 0.0 && n.is_finite()).then_some(n / per)
}

/// A stored rate as `rate list` and the dashboard show it: as set, or,
/// when it is out of what `rate set` accepts (written into the table by
/// hand), marked so with the rate the limiter paces at instead
/// (`invalid: 0/s (stored), not in force; limiter uses 1/d`).
pub fn show_stored_rate(stored: f64) -> String {
    if rates::rate_accepted(stored) {
        return show_rate(stored);
    }
    format!(
        "invalid: {stored}/s (stored), not in force; limiter uses {}",
        show_rate(rates::rate_in_force(stored))
    )
}

/// A stored burst as `rate list` and the dashboard show it (see
/// [`show_stored_rate`]).
pub fn show_stored_burst(stored: i64) -> String {
    if rates::burst_accepted(stored) {
        return stored.to_string();
    }
    format!(
        "invalid: {stored} (stored), not in force; limiter uses {}",
        rates::burst_in_force(stored)
    )
}

/// A rate as people write it: a whole number in the smallest unit that
/// gives one (`200/s`, `5000/m`, `1/h`), else three decimals in the
/// smallest unit where it is at least 1 (`2.5/s`).
pub fn show_rate(per_second: f64) -> String {
    for (unit, secs) in UNITS {
        let n = per_second * secs;
        if n >= 1.0 - 1e-9 && (n - n.round()).abs() <= 1e-9 * n {
            return format!("{}/{unit}", n.round());
        }
    }
    for (unit, secs) in UNITS {
        let n = per_second * secs;
        if n >= 1.0 || unit == "d" {
            let text = format!("{n:.3}");
            let text = text.trim_end_matches('0').trim_end_matches('.');
            if text != "0" {
                return format!("{text}/{unit}");
            }
        }
    }
    format!("{per_second:e}/s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("200/s"), Some(200.0));
        assert_eq!(parse_rate("60/m"), Some(1.0));
        assert_eq!(parse_rate("3600/h"), Some(1.0));
        assert_eq!(parse_rate("86400/d"), Some(1.0));
        assert_eq!(parse_rate("0/s"), None);
        assert_eq!(parse_rate("10/w"), None);
        assert_eq!(parse_rate("fast"), None);
    }

    #[test]
    fn rates_are_shown_in_their_unit() {
        for (typed, shown) in [
            ("200/s", "200/s"),
            ("5000/m", "5000/m"),
            ("1/h", "1/h"),
            ("1/d", "1/d"),
            ("100000/s", "100000/s"),
            ("2.5/s", "150/m"),
            ("7/d", "7/d"),
            ("0.5/d", "0.5/d"),
        ] {
            assert_eq!(show_rate(parse_rate(typed).unwrap()), shown, "{typed}");
        }
        assert_eq!(show_rate(1.0 / 7.0), "8.571/m");
        assert_eq!(show_rate(1e-300), "1e-300/s");
    }

    #[test]
    fn bounds() {
        let ok = setting("domain:Example.COM", "100000/s", Some(100_000)).unwrap();
        assert_eq!(
            (ok.group.to_string().as_str(), ok.burst),
            ("domain:example.com", 100_000)
        );
        assert_eq!(setting("campaign:x", "1/h", None).unwrap().burst, 1);
        assert!(setting("domain:*", "1/d", None).is_ok());
        for (rate, burst) in [("1e12/s", None), ("1e9/s", None), ("100001/s", None)] {
            let e = setting("campaign:x", rate, burst).unwrap_err();
            assert!(matches!(e, SettingError::TooFast { .. }), "{rate}: {e}");
            assert!(e.to_string().contains("100000/s"), "{e}");
        }
        let e = setting("campaign:x", "1e-300/s", None).unwrap_err();
        assert!(e.to_string().contains("minimum of 1/d"), "{e}");
        let e = setting("campaign:x", "10/s", Some(0)).unwrap_err();
        assert!(matches!(e, SettingError::BurstZero), "{e}");
        let e = setting("campaign:x", "10/s", Some(100_001)).unwrap_err();
        assert!(e.to_string().contains("maximum of 100000"), "{e}");
        for bad in [
            "domain:<i>x</i>.test",
            "domain:a..b",
            "domain:-x.test",
            "domain:x_y.test",
        ] {
            let e = setting(bad, "10/s", None).unwrap_err();
            assert!(matches!(e, SettingError::Name(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn stored_values_out_of_range_are_shown_as_not_in_force() {
        assert_eq!(show_stored_rate(200.0), "200/s");
        assert_eq!(show_stored_rate(MIN_RATE), "1/d");
        assert_eq!(
            show_stored_rate(0.0),
            "invalid: 0/s (stored), not in force; limiter uses 1/d"
        );
        assert_eq!(
            show_stored_rate(-3.0),
            "invalid: -3/s (stored), not in force; limiter uses 1/d"
        );
        assert_eq!(
            show_stored_rate(f64::NAN),
            "invalid: NaN/s (stored), not in force; limiter uses 1/d"
        );
        assert_eq!(
            show_stored_rate(1e9),
            "invalid: 1000000000/s (stored), not in force; limiter uses 100000/s"
        );
        assert_eq!(show_stored_burst(20), "20");
        assert_eq!(
            show_stored_burst(0),
            "invalid: 0 (stored), not in force; limiter uses 1"
        );
        assert_eq!(
            show_stored_burst(MAX_BURST + 1),
            "invalid: 100001 (stored), not in force; limiter uses 100000"
        );
    }
}
