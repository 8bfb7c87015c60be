//! A campaign's outcomes over time: how many recipients were sent and
//! failed in each bucket of its life, from the ledger's `updated_at` (the
//! time a row got its final state).
//!
//! The span is the counters' `first_at ..= last_at` (the first and last
//! outcome written), so no scan looks for it; the bucket is the shortest
//! of [`WIDTHS_MS`] that covers the span in at most [`MAX_BUCKETS`]
//! (a minute for a campaign of up to two hours, an hour for one of up to
//! five days), so a chart has a bounded number of bars however long the
//! campaign ran. One `GROUP BY` over the campaign's key range of the
//! ledger counts them: at most `MAX_BUCKETS × 2` rows come back. A row
//! stamped outside the span (a worker whose clock is behind) counts in
//! the first or last bucket, so the buckets always sum to the ledger.

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel::RunQueryDsl;

use super::campaigns::Counters;
use super::deliveries::DeliveryState;
use super::{on, Conn, Result};

/// The most buckets a timeline has.
pub const MAX_BUCKETS: i64 = 120;

const MINUTE: i64 = 60_000;

/// Bucket widths, shortest first; a longer span takes whole days.
pub const WIDTHS_MS: [i64; 12] = [
    MINUTE,
    2 * MINUTE,
    5 * MINUTE,
    10 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    60 * MINUTE,
    120 * MINUTE,
    180 * MINUTE,
    360 * MINUTE,
    720 * MINUTE,
    1440 * MINUTE,
];

/// Counts per bucket: bucket `i` holds the outcomes written in
/// `[start_ms + i × bucket_ms, start_ms + (i + 1) × bucket_ms)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// The first bucket's start, a multiple of `bucket_ms` (UTC).
    pub start_ms: i64,
    pub bucket_ms: i64,
    pub sent: Vec<i64>,
    pub failed: Vec<i64>,
}

impl Timeline {
    /// No outcome yet: no bucket at all.
    pub fn empty() -> Timeline {
        Timeline {
            start_ms: 0,
            bucket_ms: MINUTE,
            sent: Vec::new(),
            failed: Vec::new(),
        }
    }
}

/// The bucket width for outcomes spread over `span_ms`, and how many
/// buckets that makes starting at `first` (aligned down to the width).
pub fn buckets(first: i64, last: i64) -> (i64, i64, usize) {
    let last = last.max(first);
    let fits = |w: i64| {
        let start = first - first.rem_euclid(w);
        (last - start) / w < MAX_BUCKETS
    };
    let width = match WIDTHS_MS.iter().copied().find(|&w| fits(w)) {
        Some(w) => w,
        None => {
            let day = 1440 * MINUTE;
            let days = (last - first) / day / MAX_BUCKETS + 1;
            let mut w = days.saturating_mul(day);
            while !fits(w) {
                w = w.saturating_add(day);
            }
            w
        }
    };
    let start = first - first.rem_euclid(width);
    let n = (last - start) / width + 1;
    (start, width, n as usize)
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    bucket: i64,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Sent and failed per bucket for the campaign whose counters are `c`.
pub fn outcomes(conn: &mut Conn, c: &Counters) -> Result<Timeline> {
    let (Some(first), Some(last)) = (c.first_at, c.last_at) else {
        return Ok(Timeline::empty());
    };
    let (start, width, n) = buckets(first, last);
    let end = start + width * n as i64;
    // Every figure is an integer computed here: nothing from outside is
    // formatted in. CASE clamps a stray timestamp into the span on both
    // backends (SQLite has no GREATEST/LEAST).
    let sql = format!(
        "SELECT CASE WHEN updated_at < {start} THEN 0 \
                     WHEN updated_at >= {end} THEN {last_bucket} \
                     ELSE (updated_at - {start}) / {width} END AS bucket, \
                state, COUNT(*) AS n \
         FROM deliveries \
         WHERE campaign_id = {id} AND state IN ('{sent}', '{failed}') \
         GROUP BY 1, 2",
        last_bucket = n - 1,
        id = c.campaign_id,
        sent = DeliveryState::Sent.as_str(),
        failed = DeliveryState::Failed.as_str(),
    );
    let rows: Vec<Row> = on!(conn, |c| diesel::sql_query(&sql).load(c))?;
    let mut t = Timeline {
        start_ms: start,
        bucket_ms: width,
        sent: vec![0; n],
        failed: vec![0; n],
    };
    for r in rows {
        let series = if r.state == DeliveryState::Sent.as_str() {
            &mut t.sent
        } else {
            &mut t.failed
        };
        if let Some(slot) = usize::try_from(r.bucket)
            .ok()
            .and_then(|i| series.get_mut(i))
        {
            *slot += r.n;
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_campaigns_get_minutes() {
        let t0 = 1_764_156_000_000; // a whole minute
        assert_eq!(buckets(t0 + 5, t0 + 5), (t0, MINUTE, 1));
        assert_eq!(buckets(t0 + 5, t0 + 61_000), (t0, MINUTE, 2));
        assert_eq!(buckets(t0, t0 + 119 * MINUTE + 59_999), (t0, MINUTE, 120));
        assert_eq!(buckets(t0, t0 + 120 * MINUTE), (t0, 2 * MINUTE, 61));
    }

    #[test]
    fn long_campaigns_get_coarser_buckets_never_more_than_the_bound() {
        let t0 = 1_764_156_000_000;
        for span in [
            0,
            1,
            MINUTE * 500,
            MINUTE * 1440 * 3,
            MINUTE * 1440 * 400,
            i64::MAX / 4,
        ] {
            let (start, width, n) = buckets(t0 + 17, t0 + 17 + span);
            assert!(n >= 1 && n as i64 <= MAX_BUCKETS, "{span}: {n}");
            assert!(start <= t0 + 17 && start + width * n as i64 > t0 + 17 + span);
        }
        // Last before first (a clock moved back): one bucket.
        assert_eq!(buckets(t0 + 5, t0 - 1), (t0, MINUTE, 1));
    }
}
