//! Shared rate limits: one GCRA state (theoretical arrival time, `tat`) per
//! group in the database. A worker leases a few tokens at a time with a
//! conditional update on `tat`, so every worker on every machine draws from
//! the same budget and the database sees one write per batch, not per
//! message. Each leased token comes with the earliest time it conforms; a
//! worker that spends no token before its time keeps every window of length
//! W at or under `burst + W × rate`.

use diesel::prelude::*;

use super::schema::rate_groups as g;
use super::{now_ms, on, Conn, Result};
use crate::rate_group::Group;

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
    /// Share of `rate` every worker leases at (see [`throttle`]).
    pub factor: f64,
    /// The rate (tokens/s) the last throttle came at; 0 before any.
    pub ceiling: f64,
    /// When the last throttle cut the rate (ms since the epoch; 0: never).
    pub cut_at: i64,
    /// When the factor last changed (ms since the epoch; 0: never).
    pub adapted_at: i64,
    /// The reply that caused the last cut.
    pub adapted_reason: Option<String>,
}

impl RateGroup {
    /// Microseconds between two tokens at the configured rate (rounded up,
    /// and paced slightly under the limit: never faster than asked).
    pub fn interval_us(&self) -> i64 {
        interval_us(self.rate)
    }

    /// The rate in force after throttling replies (tokens/s).
    pub fn adapted_rate(&self) -> f64 {
        adapted(self.rate, self.factor)
    }
}

/// A throttle cuts a group's rate at most this often: the replies to
/// messages already leased at the old rate arrive after the cut and must
/// not cut it again.
pub const CUT_INTERVAL_MS: i64 = 1_000;
/// A group recovers one step per this long without a throttle.
pub const RECOVERY_STEP_MS: i64 = 1_000;
/// Lowest share of the configured rate a throttle goes down to.
const MIN_FACTOR: f64 = 1.0 / 1024.0;
/// Recovery steps: half as much again while the rate is well under the
/// one the last throttle came at (below `NEAR_CEILING` of it), so the
/// second after a cut is already near it; a fiftieth per step from there
/// to a tenth past it (`PAST_CEILING`), so the rate spends most of its
/// time just under the relay's quota instead of swinging between half and
/// over it; a quarter per step beyond (the quota was raised).
const FAST_STEP: f64 = 1.5;
const SLOW_STEP: f64 = 1.02;
const PAST_STEP: f64 = 1.25;
const NEAR_CEILING: f64 = 0.9;
const PAST_CEILING: f64 = 1.1;
/// A throttle that comes after the rate had recovered a step since the
/// last cut found the quota again (the lower rate was clean): the rate
/// goes to this share, not to half. Throttles one after the other with no
/// clean step between (the rate is still far over the quota, e.g. on the
/// way down from a configured rate twenty times the quota) halve it. With
/// halving only, three workers behind a relay's quota averaged three
/// quarters of it (BENCHMARKS.md, "Throttling relay").
const FOUND_CUT: f64 = 0.8;

/// The rate a factor gives (within what the limiter accepts).
fn adapted(rate: f64, factor: f64) -> f64 {
    let f = if factor.is_finite() {
        factor.clamp(MIN_FACTOR, 1.0)
    } else {
        1.0
    };
    rate_in_force(rate) * f
}

/// The factor after one recovery step from `factor`, for a group of
/// `rate` whose last throttle came at `ceiling` tokens/s.
pub fn recovered_factor(rate: f64, factor: f64, ceiling: f64) -> f64 {
    let rate = rate_in_force(rate);
    let now = adapted(rate, factor);
    let near = ceiling * NEAR_CEILING;
    let next = if ceiling > 0.0 && now < near {
        (now * FAST_STEP).min(near)
    } else if now < ceiling * PAST_CEILING {
        now * SLOW_STEP
    } else {
        now * PAST_STEP
    };
    (next / rate).min(1.0)
}

/// The factor after a throttle at `factor`: half, or [`FOUND_CUT`] of
/// it when the rate had `recovered` a step since the last cut.
pub fn cut_factor(factor: f64, recovered: bool) -> f64 {
    let share = if recovered { FOUND_CUT } else { 0.5 };
    (factor.clamp(MIN_FACTOR, 1.0) * share).max(MIN_FACTOR)
}

/// A throttling reply for group `name`: cut its rate for every worker (see
/// [`cut_factor`]), unless it was cut less than [`CUT_INTERVAL_MS`] ago.
/// Returns the new factor, or `None` when nothing changed (cut lately, or
/// no such group).
pub fn throttle(conn: &mut Conn, name: &str, reason: &str, now_ms: i64) -> Result<Option<f64>> {
    let row: Option<(f64, f64, i64, i64)> = on!(conn, |c| g::table
        .find(name)
        .select((g::rate, g::factor, g::cut_at, g::adapted_at))
        .first(c)
        .optional())?;
    let Some((rate, factor, cut_at, adapted_at)) = row else {
        return Ok(None);
    };
    if now_ms - cut_at < CUT_INTERVAL_MS {
        return Ok(None);
    }
    let next = cut_factor(factor, cut_at > 0 && adapted_at > cut_at);
    // Conditional on the cut time read: of workers throttled at once,
    // one cuts.
    let updated = on!(conn, |c| diesel::update(
        g::table.find(name).filter(g::cut_at.eq(cut_at))
    )
    .set((
        g::factor.eq(next),
        g::ceiling.eq(adapted(rate, factor)),
        g::cut_at.eq(now_ms),
        g::adapted_at.eq(now_ms),
        g::adapted_reason.eq(reason),
    ))
    .execute(c))?;
    Ok((updated == 1).then_some(next))
}

/// Clean replies for group `name`: one recovery step, if the last change
/// is at least [`RECOVERY_STEP_MS`] old. Returns the factor now (1 when
/// the group is not adapted), or `None` for no such group.
pub fn recover(conn: &mut Conn, name: &str, now_ms: i64) -> Result<Option<f64>> {
    let row: Option<(f64, f64, f64, i64)> = on!(conn, |c| g::table
        .find(name)
        .select((g::rate, g::factor, g::ceiling, g::adapted_at))
        .first(c)
        .optional())?;
    let Some((rate, factor, ceiling, adapted_at)) = row else {
        return Ok(None);
    };
    if factor >= 1.0 || now_ms - adapted_at < RECOVERY_STEP_MS {
        return Ok(Some(factor.min(1.0)));
    }
    let next = recovered_factor(rate, factor, ceiling);
    let updated = on!(conn, |c| diesel::update(
        g::table
            .find(name)
            .filter(g::adapted_at.eq(adapted_at))
            .filter(g::factor.eq(factor))
    )
    .set((g::factor.eq(next), g::adapted_at.eq(now_ms)))
    .execute(c))?;
    Ok(Some(if updated == 1 { next } else { factor }))
}

/// Fastest rate a group may have, tokens per second: `rate set` refuses
/// more, and a faster rate written into the table by hand is read as this.
pub const MAX_RATE: f64 = 100_000.0;
/// Slowest rate a group may have: one token a day.
pub const MIN_RATE: f64 = 1.0 / 86_400.0;
/// Largest burst a group may have (a second's worth at [`MAX_RATE`]).
pub const MAX_BURST: i64 = 100_000;
/// Most tokens one lease grants: what [`MAX_RATE`] grants in a worker's
/// 50 ms lease horizon. Whatever a row says, a lease moves the group's
/// schedule at most this many tokens ahead.
pub const MAX_LEASE: u32 = 5_000;

/// Tokens are paced at this share of the configured rate: timers and the
/// network add a little jitter between a token's time and the relay seeing
/// the message, and the limit must hold as the relay counts.
const PACE: f64 = 0.95;

/// Whether a stored rate is one `rate set` accepts (within a hair of
/// [`MIN_RATE`]..=[`MAX_RATE`]), so the limiter uses it as stored.
pub fn rate_accepted(stored: f64) -> bool {
    (MIN_RATE * (1.0 - 1e-12)..=MAX_RATE * (1.0 + 1e-12)).contains(&stored)
}

/// The rate the limiter paces a group at: the stored rate brought within
/// [`MIN_RATE`]..=[`MAX_RATE`]; a NaN (a hand-written row) reads as the
/// slowest (`clamp` would keep it).
pub fn rate_in_force(stored: f64) -> f64 {
    if stored.is_nan() {
        MIN_RATE
    } else {
        stored.clamp(MIN_RATE, MAX_RATE)
    }
}

/// Whether a stored burst is one `rate set` accepts (1..=[`MAX_BURST`]).
pub fn burst_accepted(stored: i64) -> bool {
    (1..=MAX_BURST).contains(&stored)
}

/// The burst the limiter allows: the stored one within 1..=[`MAX_BURST`].
pub fn burst_in_force(stored: i64) -> i64 {
    stored.clamp(1, MAX_BURST)
}

fn interval_us(rate: f64) -> i64 {
    (1e6 / (rate_in_force(rate) * PACE)).ceil().max(1.0) as i64
}

/// Recompute the observed rate at most this often.
const OBSERVE_WINDOW_US: i64 = 5_000_000;

/// A group's name as stored (see [`Group`]): a domain group in lower
/// case, its non-ASCII labels as A-labels. Whether a `campaign:` group
/// names a campaign is the caller's check (see `limits`).
pub fn check_name(name: &str) -> Result<String> {
    Ok(name.parse::<Group>()?.to_string())
}

/// Whether a campaign of exactly this name exists (not an id, not another
/// spelling): what a `campaign:NAME` group must name.
pub fn campaign_exists(conn: &mut Conn, name: &str) -> Result<bool> {
    use super::schema::campaigns as c;
    let n: i64 = on!(conn, |x| c::table
        .filter(c::name.eq(name))
        .count()
        .get_result(x))?;
    Ok(n > 0)
}

/// Create or change a group; its position in time (`tat`) is kept, and a
/// new rate starts unadapted (the operator's word stands until the relay
/// throttles again).
pub fn set(conn: &mut Conn, name: &str, rate: f64, burst: i64) -> Result<()> {
    let name = &check_name(name)?;
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
        .set((
            g::rate.eq(rate),
            g::burst.eq(burst),
            g::updated_at.eq(now),
            g::factor.eq(1.0),
            g::ceiling.eq(0.0),
        ))
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
    let name = check_name(name).unwrap_or_else(|_| name.to_string());
    Ok(on!(conn, |c| diesel::delete(g::table.find(&name)).execute(c))? > 0)
}

/// One worker's use of one group (see [`report_usage`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub name: String,
    /// Tokens spent, in total and per second lately.
    pub spent: i64,
    pub spent_rate: f64,
    /// Recipients waiting for tokens inside the worker.
    pub parked: i64,
    /// Recipients deferred into delayed jobs that are not due yet.
    pub deferred: i64,
}

/// Write a worker's usage of every group it uses, in one transaction (at
/// its heartbeat), and drop its rows of groups it no longer uses.
pub fn report_usage(conn: &mut Conn, worker: &str, rows: &[Usage]) -> Result<()> {
    use super::schema::rate_usage as u;
    let now = now_ms();
    conn.transaction(|conn| {
        for r in rows {
            on!(conn, |c| diesel::insert_into(u::table)
                .values((
                    u::worker.eq(worker),
                    u::name.eq(&r.name),
                    u::spent.eq(r.spent),
                    u::spent_rate.eq(r.spent_rate),
                    u::parked.eq(r.parked),
                    u::deferred.eq(r.deferred),
                    u::seen_at.eq(now),
                ))
                .on_conflict((u::worker, u::name))
                .do_update()
                .set((
                    u::spent.eq(r.spent),
                    u::spent_rate.eq(r.spent_rate),
                    u::parked.eq(r.parked),
                    u::deferred.eq(r.deferred),
                    u::seen_at.eq(now),
                ))
                .execute(c))?;
        }
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        on!(conn, |c| diesel::delete(
            u::table
                .filter(u::worker.eq(worker))
                .filter(u::name.ne_all(&names))
        )
        .execute(c))?;
        Ok(())
    })
}

/// Remove the usage rows of workers silent since before `cutoff` (ms).
pub fn forget_usage_before(conn: &mut Conn, cutoff: i64) -> Result<usize> {
    use super::schema::rate_usage as u;
    Ok(on!(conn, |c| diesel::delete(
        u::table.filter(u::seen_at.lt(cutoff))
    )
    .execute(c))?)
}

/// Remove a worker's usage rows (it exits).
pub fn forget_usage(conn: &mut Conn, worker: &str) -> Result<()> {
    use super::schema::rate_usage as u;
    on!(conn, |c| diesel::delete(
        u::table.filter(u::worker.eq(worker))
    )
    .execute(c))?;
    Ok(())
}

/// One worker's usage rows (as of its last heartbeat).
pub fn usage_of(conn: &mut Conn, worker: &str) -> Result<Vec<Usage>> {
    use super::schema::rate_usage as u;
    let rows: Vec<(String, i64, f64, i64, i64)> = on!(conn, |c| u::table
        .filter(u::worker.eq(worker))
        .order(u::name)
        .select((u::name, u::spent, u::spent_rate, u::parked, u::deferred))
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(name, spent, spent_rate, parked, deferred)| Usage {
            name,
            spent,
            spent_rate,
            parked,
            deferred,
        })
        .collect())
}

/// Usage per group summed over the workers heard from since `since_ms`.
pub fn usage_since(conn: &mut Conn, since_ms: i64) -> Result<Vec<Usage>> {
    use super::schema::rate_usage as u;
    let rows: Vec<(String, i64, f64, i64, i64)> = on!(conn, |c| u::table
        .filter(u::seen_at.ge(since_ms))
        .select((u::name, u::spent, u::spent_rate, u::parked, u::deferred))
        .load(c))?;
    let mut out: std::collections::BTreeMap<String, Usage> = Default::default();
    for (name, spent, spent_rate, parked, deferred) in rows {
        let e = out.entry(name.clone()).or_insert_with(|| Usage {
            name,
            ..Usage::default()
        });
        e.spent += spent;
        e.spent_rate += spent_rate;
        e.parked += parked;
        e.deferred += deferred;
    }
    Ok(out.into_values().collect())
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
        let row: Option<(f64, f64, i64, i64)> = on!(conn, |c| g::table
            .find(name)
            .select((g::rate, g::factor, g::burst, g::tat))
            .first(c)
            .optional())?;
        let Some((rate, factor, burst, tat)) = row else {
            return Ok(Lease::NoGroup);
        };
        let t = interval_us(adapted(rate, factor));
        let base = tat.max(now_us);
        // Token i is conforming at base + (i+1)·T − burst·T.
        let burst_us = burst_in_force(burst) * t;
        let room = (now_us + horizon_us + burst_us - base) / t;
        if room < 1 {
            return Ok(Lease::Wait(base + t - burst_us - horizon_us - now_us));
        }
        let count = (want.clamp(1, MAX_LEASE) as i64).min(room);
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

#[cfg(test)]
mod tests;
