//! Shared rate limits: one GCRA state (theoretical arrival time, `tat`) per
//! group in the database. A worker leases a few tokens at a time with a
//! conditional update on `tat`, so every worker on every machine draws from
//! the same budget and the database sees one write per batch, not per
//! message. Each leased token comes with the earliest time it conforms; a
//! worker that spends no token before its time keeps every window of length
//! W at or under `burst + W × rate`.

use diesel::prelude::*;

use super::schema::rate_groups as g;
use super::{now_ms, on, Conn, Result, StoreError};

#[derive(Debug, Clone, Queryable, Selectable, PartialEq)]
#[diesel(table_name = g)]
pub struct RateGroup {
    pub name: String,
    /// Tokens per second.
    pub rate: f64,
    pub burst: i64,
    /// Theoretical arrival time, µs since the epoch.
    pub tat: i64,
    /// Tokens granted in total.
    pub leased: i64,
    pub window_at: i64,
    pub window_leased: i64,
    /// Tokens granted per second over the last window.
    pub observed: f64,
    pub updated_at: i64,
}

impl RateGroup {
    /// Microseconds between two tokens (rounded up, and paced slightly under
    /// the limit: never faster than asked).
    pub fn interval_us(&self) -> i64 {
        interval_us(self.rate)
    }
}

/// Tokens are paced at this share of the configured rate: timers and the
/// network add a little jitter between a token's time and the relay seeing
/// the message, and the limit must hold as the relay counts.
const PACE: f64 = 0.95;

fn interval_us(rate: f64) -> i64 {
    (1e6 / (rate * PACE)).ceil().max(1.0) as i64
}

/// Recompute the observed rate at most this often.
const OBSERVE_WINDOW_US: i64 = 5_000_000;

/// Groups are named `relay:HOST:PORT`, `campaign:NAME`, `domain:DOMAIN` or
/// `domain:*` (every domain without a group of its own).
pub fn check_name(name: &str) -> Result<()> {
    let ok = ["relay:", "campaign:", "domain:"]
        .iter()
        .any(|p| name.len() > p.len() && name.starts_with(p));
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadRateGroup(name.to_string()))
    }
}

/// Create or change a group; its position in time (`tat`) is kept.
pub fn set(conn: &mut Conn, name: &str, rate: f64, burst: i64) -> Result<()> {
    check_name(name)?;
    let now = now_ms();
    on!(conn, |c| diesel::insert_into(g::table)
        .values((
            g::name.eq(name),
            g::rate.eq(rate),
            g::burst.eq(burst),
            g::updated_at.eq(now),
        ))
        .on_conflict(g::name)
        .do_update()
        .set((g::rate.eq(rate), g::burst.eq(burst), g::updated_at.eq(now)))
        .execute(c))?;
    Ok(())
}

pub fn list(conn: &mut Conn) -> Result<Vec<RateGroup>> {
    Ok(on!(conn, |c| g::table
        .order(g::name)
        .select(RateGroup::as_select())
        .load(c))?)
}

/// Remove a group; false when there was none.
pub fn delete(conn: &mut Conn, name: &str) -> Result<bool> {
    Ok(on!(conn, |c| diesel::delete(g::table.find(name)).execute(c))? > 0)
}

/// The answer to a lease request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// `count` tokens; token `i` (from 0) conforms from `first_at_us + i ×
    /// interval_us` on.
    Granted {
        count: u32,
        first_at_us: i64,
        interval_us: i64,
    },
    /// None available; the next conforms in this many µs.
    Wait(i64),
    /// The group does not exist (any more).
    NoGroup,
}

/// Lease up to `want` tokens of `name` at time `now_us`, including tokens
/// that conform up to `horizon_us` in the future (the caller waits for each
/// token's time before spending it).
pub fn lease(
    conn: &mut Conn,
    name: &str,
    want: u32,
    now_us: i64,
    horizon_us: i64,
) -> Result<Lease> {
    for _ in 0..8 {
        let row: Option<(f64, i64, i64)> = on!(conn, |c| g::table
            .find(name)
            .select((g::rate, g::burst, g::tat))
            .first(c)
            .optional())?;
        let Some((rate, burst, tat)) = row else {
            return Ok(Lease::NoGroup);
        };
        let t = interval_us(rate);
        let base = tat.max(now_us);
        // Token i is conforming at base + (i+1)·T − burst·T.
        let burst_us = burst.max(1) * t;
        let room = (now_us + horizon_us + burst_us - base) / t;
        if room < 1 {
            return Ok(Lease::Wait(base + t - burst_us - horizon_us - now_us));
        }
        let count = (want.max(1) as i64).min(room);
        let new_tat = base + count * t;
        let updated = on!(conn, |c| diesel::update(
            g::table.find(name).filter(g::tat.eq(tat))
        )
        .set((g::tat.eq(new_tat), g::leased.eq(g::leased + count)))
        .execute(c))?;
        if updated == 1 {
            observe(conn, name, now_us)?;
            return Ok(Lease::Granted {
                count: count as u32,
                first_at_us: base + t - burst_us,
                interval_us: t,
            });
        }
        // Another worker moved `tat` first: read again.
    }
    Ok(Lease::Wait(1_000))
}

/// Every few seconds, turn the granted-token count into an observed rate.
fn observe(conn: &mut Conn, name: &str, now_us: i64) -> Result<()> {
    use diesel::dsl::sql;
    use diesel::sql_types::Double;
    on!(conn, |c| diesel::update(
        g::table
            .find(name)
            .filter(g::window_at.gt(0))
            .filter(g::window_at.le(now_us - OBSERVE_WINDOW_US))
    )
    .set((
        // Only integers are formatted into this expression.
        g::observed.eq(sql::<Double>(&format!(
            "(leased - window_leased) * 1000000.0 / ({now_us} - window_at)"
        ))),
        g::window_leased.eq(g::leased),
        g::window_at.eq(now_us),
    ))
    .execute(c))?;
    on!(conn, |c| diesel::update(
        g::table.find(name).filter(g::window_at.eq(0))
    )
    .set((g::window_leased.eq(g::leased), g::window_at.eq(now_us)))
    .execute(c))?;
    Ok(())
}
