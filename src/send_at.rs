//! `--send-at TIME`: when a scheduled campaign may start. The time is
//! RFC 3339 (`2026-12-01T09:00:00+01:00`) and stored as ms since the epoch
//! (`campaigns.send_at`); every stage that puts or meets a job of a
//! campaign not started yet delays it by what is left, at most
//! [`MAX_WAIT`]: a job never waits in beanstalkd much longer than an hour
//! past a start that was moved earlier, and an early job costs one release
//! (one binlog record) per hour, never a loop.

use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Longest delay a job of a campaign not started yet is put or released
/// with.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);
/// How far in the past a `--send-at` may lie and still be taken (as
/// "now"): a time typed a moment ago, or a small clock difference.
pub const GRACE: Duration = Duration::from_secs(60);

/// Why a `--send-at` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendAtError {
    #[error("bad --send-at {0:?}: use RFC 3339, e.g. 2026-12-01T09:00:00+01:00 (or `now`)")]
    Unreadable(String),
    #[error("--send-at {0} is in the past: give a later time, or `now` to send once enqueued")]
    Past(String),
}

/// Read `--send-at` as of `now_ms`: `Ok(None)` for `now` (no schedule),
/// the time in ms otherwise; a time more than [`GRACE`] ago is refused.
pub fn parse(raw: &str, now_ms: i64) -> Result<Option<i64>, SendAtError> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("now") {
        return Ok(None);
    }
    let at = OffsetDateTime::parse(raw, &Rfc3339)
        .map_err(|_| SendAtError::Unreadable(raw.to_string()))?;
    let ms = i64::try_from(at.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| SendAtError::Unreadable(raw.to_string()))?;
    if ms < now_ms - GRACE.as_millis() as i64 {
        return Err(SendAtError::Past(raw.to_string()));
    }
    Ok(Some(ms))
}

/// How long a job of a campaign starting at `send_at` waits at `now_ms`
/// before a worker may take it: what is left, rounded up to whole seconds
/// (beanstalkd's unit: a job never comes back a fraction early), at most
/// [`MAX_WAIT`]; `None` once the time has come (or there is none).
pub fn wait(send_at: Option<i64>, now_ms: i64) -> Option<Duration> {
    let left = send_at? - now_ms;
    if left <= 0 {
        return None;
    }
    let secs = (left as u64).div_ceil(1000);
    Some(Duration::from_secs(secs).min(MAX_WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_156_000_000; // 2025-11-26T11:20:00Z

    #[test]
    fn reads_rfc3339_with_offsets_and_refuses_the_past() {
        assert_eq!(parse("2025-11-26T12:20:00+01:00", NOW), Ok(Some(NOW)));
        assert_eq!(parse("2025-11-26T11:20:10.5Z", NOW), Ok(Some(NOW + 10_500)));
        assert_eq!(parse(" now ", NOW), Ok(None));
        // Within the grace: taken as it is (workers send at once).
        assert_eq!(parse("2025-11-26T11:19:30Z", NOW), Ok(Some(NOW - 30_000)));
        assert!(matches!(
            parse("2025-11-26T11:18:00Z", NOW),
            Err(SendAtError::Past(_))
        ));
        for bad in ["tomorrow", "2025-11-26 11:20", "2025-11-26T11:20:00", ""] {
            assert!(
                matches!(parse(bad, NOW), Err(SendAtError::Unreadable(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn waits_what_is_left_in_whole_seconds_at_most_an_hour() {
        assert_eq!(wait(None, NOW), None);
        assert_eq!(wait(Some(NOW), NOW), None);
        assert_eq!(wait(Some(NOW - 5), NOW), None);
        assert_eq!(wait(Some(NOW + 1), NOW), Some(Duration::from_secs(1)));
        assert_eq!(wait(Some(NOW + 2_001), NOW), Some(Duration::from_secs(3)));
        assert_eq!(wait(Some(NOW + 86_400_000), NOW), Some(MAX_WAIT));
    }
}
