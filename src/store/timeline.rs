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
//!
//! A campaign that tracks opens or clicks also gets, on the
//! same buckets, its recipients' first (human) opens and first clicks
//! from the `engagement` rows: the span then reaches from the first
//! outcome or engagement to the last (readers open mail after the send
//! ends), read with one aggregate over the campaign's key range of
//! `engagement`, and each series is one more bounded `GROUP BY` there.
//! The buckets of each sum to the unique openers and clickers.

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel::RunQueryDsl;

use super::campaigns::Counters;
use super::content::Track;
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
    /// Recipients whose first open by a person fell in each bucket;
    /// `None` when the campaign does not track opens.
    pub opens: Option<Vec<i64>>,
    /// Recipients whose first click fell in each bucket; `None` when the
    /// campaign does not track clicks.
    pub clicks: Option<Vec<i64>>,
}

impl Timeline {
    /// No outcome yet: no bucket at all.
    pub fn empty() -> Timeline {
        Timeline {
            start_ms: 0,
            bucket_ms: MINUTE,
            sent: Vec::new(),
            failed: Vec::new(),
            opens: None,
            clicks: None,
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
    read(conn, c, Track::default())
}

/// Sent and failed per bucket, and the first opens and clicks of what
/// `track` names, all on one axis.
pub fn read(conn: &mut Conn, c: &Counters, track: Track) -> Result<Timeline> {
    let mut span = (c.first_at, c.last_at);
    if track.any() {
        let (first, last) = engagement_span(conn, c.campaign_id, track)?;
        span = (min_of(span.0, first), max_of(span.1, last));
    }
    let (Some(first), Some(last)) = span else {
        let mut t = Timeline::empty();
        t.opens = track.opens.then(Vec::new);
        t.clicks = track.clicks.then(Vec::new);
        return Ok(t);
    };
    let (start, width, n) = buckets(first, last);
    let b = Bucketing { start, width, n };
    let mut t = Timeline {
        start_ms: start,
        bucket_ms: width,
        sent: vec![0; n],
        failed: vec![0; n],
        opens: None,
        clicks: None,
    };
    // Every figure is an integer computed here: nothing from outside is
    // formatted in.
    let sql = format!(
        "SELECT {bucket} AS bucket, state, COUNT(*) AS n \
         FROM deliveries \
         WHERE campaign_id = {id} AND state IN ('{sent}', '{failed}') \
         GROUP BY 1, 2",
        bucket = b.expr("updated_at"),
        id = c.campaign_id,
        sent = DeliveryState::Sent.as_str(),
        failed = DeliveryState::Failed.as_str(),
    );
    let rows: Vec<Row> = on!(conn, |c| diesel::sql_query(&sql).load(c))?;
    for r in rows {
        let series = if r.state == DeliveryState::Sent.as_str() {
            &mut t.sent
        } else {
            &mut t.failed
        };
        add(series, r.bucket, r.n);
    }
    if track.opens {
        t.opens = Some(firsts(conn, c.campaign_id, "first_open_at", &b)?);
    }
    if track.clicks {
        t.clicks = Some(firsts(conn, c.campaign_id, "first_click_at", &b)?);
    }
    Ok(t)
}

/// `n` buckets of `width` ms from `start`.
struct Bucketing {
    start: i64,
    width: i64,
    n: usize,
}

impl Bucketing {
    /// The bucket of `column` as SQL; CASE clamps a stray timestamp into
    /// the span on both backends (SQLite has no GREATEST/LEAST).
    fn expr(&self, column: &str) -> String {
        let (start, width) = (self.start, self.width);
        let end = start + width * self.n as i64;
        format!(
            "CASE WHEN {column} < {start} THEN 0 \
                  WHEN {column} >= {end} THEN {last} \
                  ELSE ({column} - {start}) / {width} END",
            last = self.n as i64 - 1
        )
    }
}

fn add(series: &mut [i64], bucket: i64, n: i64) {
    if let Some(slot) = usize::try_from(bucket).ok().and_then(|i| series.get_mut(i)) {
        *slot += n;
    }
}

fn min_of(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.into_iter().chain(b).min()
}

fn max_of(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.into_iter().chain(b).max()
}

#[derive(QueryableByName)]
struct Span {
    #[diesel(sql_type = Nullable<BigInt>)]
    open_min: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    open_max: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    click_min: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    click_max: Option<i64>,
}

/// The earliest and latest first open and first click of the tracked
/// kinds: one aggregate over the campaign's `engagement` rows.
fn engagement_span(
    conn: &mut Conn,
    campaign: i64,
    track: Track,
) -> Result<(Option<i64>, Option<i64>)> {
    let sql = format!(
        "SELECT MIN(first_open_at) AS open_min, MAX(first_open_at) AS open_max, \
                MIN(first_click_at) AS click_min, MAX(first_click_at) AS click_max \
         FROM engagement WHERE campaign_id = {campaign}"
    );
    let rows: Vec<Span> = on!(conn, |c| diesel::sql_query(&sql).load(c))?;
    let Some(s) = rows.into_iter().next() else {
        return Ok((None, None));
    };
    let (opens, clicks) = (track.opens, track.clicks);
    Ok((
        min_of(s.open_min.filter(|_| opens), s.click_min.filter(|_| clicks)),
        max_of(s.open_max.filter(|_| opens), s.click_max.filter(|_| clicks)),
    ))
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    bucket: i64,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Recipients whose `column` (`first_open_at`, `first_click_at`) falls in
/// each bucket: one `GROUP BY`, at most `n` rows.
fn firsts(conn: &mut Conn, campaign: i64, column: &str, b: &Bucketing) -> Result<Vec<i64>> {
    let sql = format!(
        "SELECT {bucket} AS bucket, COUNT(*) AS n FROM engagement \
         WHERE campaign_id = {campaign} AND {column} IS NOT NULL GROUP BY 1",
        bucket = b.expr(column),
    );
    let rows: Vec<Count> = on!(conn, |c| diesel::sql_query(&sql).load(c))?;
    let mut series = vec![0; b.n];
    for r in rows {
        add(&mut series, r.bucket, r.n);
    }
    Ok(series)
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
