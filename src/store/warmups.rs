//! Warm-up schedules of rate groups (`mailsplit rate warmup`): a budget of
//! tokens per period ("day"), counted in the database across every worker,
//! that grows by a factor each day up to a final rate. A worker's lease
//! ([`lease`]) takes from the day's budget first, with a conditional
//! update on the day's count (so two workers never both take the last
//! tokens), then from the group's GCRA schedule (`store::rates`), and
//! gives back what the GCRA did not grant. Past the budget the lease
//! answers "wait until the next day begins".

use diesel::prelude::*;

use super::rates::{self, Lease};
use super::schema::rate_warmups as w;
use super::{on, Conn, Result};

/// One group's schedule and the count of its current day.
#[derive(Debug, Clone, Queryable, Selectable, PartialEq)]
#[diesel(table_name = w)]
pub struct Warmup {
    /// The rate group.
    pub name: String,
    /// Day 0's rate, tokens per second.
    pub start_rate: f64,
    /// Each day's rate is the day before's times this.
    pub factor: f64,
    /// Length of a day, ms.
    pub every_ms: i64,
    /// The rate the schedule ends at, tokens per second.
    pub until_rate: f64,
    /// When day 0 began (ms since the epoch).
    pub since_ms: i64,
    /// The day `used` counts.
    pub period: i64,
    /// Tokens granted in day `period`.
    pub used: i64,
}

/// A schedule as `rate warmup` sets it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub start_rate: f64,
    pub factor: f64,
    pub every_ms: i64,
    pub until_rate: f64,
}

impl Warmup {
    /// The day that `now_ms` falls in (0 before `since_ms`).
    pub fn day_at(&self, now_ms: i64) -> i64 {
        (now_ms - self.since_ms).max(0) / self.every_ms.max(1)
    }

    /// When day `k` begins (ms since the epoch).
    pub fn day_start(&self, k: i64) -> i64 {
        self.since_ms
            .saturating_add(k.saturating_mul(self.every_ms.max(1)))
    }

    /// The rate of day `k`: min(start × factor^k, until), tokens/s.
    pub fn rate_of(&self, k: i64) -> f64 {
        let k = k.clamp(0, i64::from(i32::MAX)) as i32;
        let r = self.start_rate * self.factor.powi(k);
        if r.is_finite() {
            r.min(self.until_rate)
        } else {
            self.until_rate
        }
    }

    /// Tokens day `k` allows (at least 1).
    pub fn allowance(&self, k: i64) -> i64 {
        let n = (self.rate_of(k) * self.every_ms as f64 / 1000.0).floor();
        if n.is_finite() {
            (n as i64).max(1)
        } else {
            1
        }
    }

    /// Tokens granted so far in the day `now_ms` falls in.
    pub fn used_at(&self, now_ms: i64) -> i64 {
        if self.period == self.day_at(now_ms) {
            self.used
        } else {
            0
        }
    }

    /// The first day whose rate is the final one.
    pub fn last_day(&self) -> i64 {
        if self.start_rate >= self.until_rate || self.factor <= 1.0 {
            return 0;
        }
        let k = ((self.until_rate / self.start_rate).ln() / self.factor.ln()).ceil();
        if k.is_finite() {
            (k as i64).max(0)
        } else {
            0
        }
    }

    /// How long, from `now_ms`, until `pending` more tokens are granted
    /// at the schedule's pace, when they do not fit in what is left of
    /// today (`None` when they do): the end of the day that grants the
    /// last of them, less the part of that day they leave unused. The
    /// second value is that day's number.
    pub fn finish_after(&self, pending: i64, now_ms: i64) -> Option<(i64, i64)> {
        let today = self.day_at(now_ms);
        let left_today = (self.allowance(today) - self.used_at(now_ms)).max(0);
        let mut rest = pending - left_today;
        if rest <= 0 {
            return None;
        }
        let mut k = today + 1;
        // Past the last day every day allows the same: jump there.
        while rest > self.allowance(k) {
            if k >= self.last_day() {
                let per_day = self.allowance(k);
                let days = (rest - 1) / per_day;
                k += days;
                rest -= days * per_day;
                break;
            }
            rest -= self.allowance(k);
            k += 1;
        }
        let share = rest as f64 / self.allowance(k) as f64;
        let end = self.day_start(k) + (share * self.every_ms as f64).ceil() as i64;
        Some(((end - now_ms).max(0), k))
    }
}

/// Set (or replace) `name`'s schedule, starting day 0 at `now_ms`.
pub fn set(conn: &mut Conn, name: &str, s: &Schedule, now_ms: i64) -> Result<()> {
    let values = (
        w::start_rate.eq(s.start_rate),
        w::factor.eq(s.factor),
        w::every_ms.eq(s.every_ms),
        w::until_rate.eq(s.until_rate),
        w::since_ms.eq(now_ms),
        w::period.eq(0),
        w::used.eq(0),
    );
    on!(conn, |c| diesel::insert_into(w::table)
        .values((w::name.eq(name), values))
        .on_conflict(w::name)
        .do_update()
        .set(values)
        .execute(c))?;
    Ok(())
}

/// Remove `name`'s schedule; false when it had none.
pub fn delete(conn: &mut Conn, name: &str) -> Result<bool> {
    Ok(on!(conn, |c| diesel::delete(w::table.find(name)).execute(c))? > 0)
}

/// Mark group `name` as changed (its `updated_at`), so every worker
/// drops what it knew of the group's budget (a wait until the next day).
pub fn touch_group(conn: &mut Conn, name: &str, now_ms: i64) -> Result<()> {
    use super::schema::rate_groups as g;
    on!(conn, |c| diesel::update(g::table.find(name))
        .set(g::updated_at.eq(now_ms))
        .execute(c))?;
    Ok(())
}

/// Every schedule, by group name.
pub fn list(conn: &mut Conn) -> Result<Vec<Warmup>> {
    Ok(on!(conn, |c| w::table
        .order(w::name)
        .select(Warmup::as_select())
        .load(c))?)
}

fn get(conn: &mut Conn, name: &str) -> Result<Option<Warmup>> {
    Ok(on!(conn, |c| w::table
        .find(name)
        .select(Warmup::as_select())
        .first(c)
        .optional())?)
}

/// What today's budget gave a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// `count` tokens of day `day`.
    Granted { count: u32, day: i64 },
    /// Today's budget is spent: the next day begins at this time (ms).
    Spent { next_day_ms: i64 },
}

/// Take up to `want` tokens from today's budget of `name`; `None` when
/// the group has no warm-up.
pub fn take(conn: &mut Conn, name: &str, want: u32, now_ms: i64) -> Result<Option<Budget>> {
    for _ in 0..8 {
        let Some(row) = get(conn, name)? else {
            return Ok(None);
        };
        let day = row.day_at(now_ms);
        let used = row.used_at(now_ms);
        let left = row.allowance(day) - used;
        if left <= 0 {
            return Ok(Some(Budget::Spent {
                next_day_ms: row.day_start(day + 1),
            }));
        }
        let count = i64::from(want.max(1)).min(left);
        // Conditional on the count read: of workers taking at once, one
        // wins and the others read again.
        let updated = on!(conn, |c| diesel::update(
            w::table
                .find(name)
                .filter(w::period.eq(row.period))
                .filter(w::used.eq(row.used))
                .filter(w::since_ms.eq(row.since_ms))
        )
        .set((w::period.eq(day), w::used.eq(used + count)))
        .execute(c))?;
        if updated == 1 {
            return Ok(Some(Budget::Granted {
                count: count as u32,
                day,
            }));
        }
    }
    // Lost every race: ask again in a moment.
    Ok(Some(Budget::Spent {
        next_day_ms: now_ms + 1,
    }))
}

/// Return `count` tokens taken from day `day` but not granted.
pub fn give_back(conn: &mut Conn, name: &str, day: i64, count: u32) -> Result<()> {
    let n = i64::from(count);
    on!(conn, |c| diesel::update(
        w::table
            .find(name)
            .filter(w::period.eq(day))
            .filter(w::used.ge(n))
    )
    .set(w::used.eq(w::used - n))
    .execute(c))?;
    Ok(())
}

/// [`rates::lease`] within the group's warm-up budget, if it has one.
pub fn lease(
    conn: &mut Conn,
    name: &str,
    want: u32,
    now_us: i64,
    horizon_us: i64,
) -> Result<Lease> {
    let now_ms = now_us.div_euclid(1_000);
    let (want, day) = match take(conn, name, want, now_ms)? {
        None => return rates::lease(conn, name, want, now_us, horizon_us),
        Some(Budget::Spent { next_day_ms }) => {
            return Ok(Lease::Wait((next_day_ms * 1_000 - now_us).max(1_000)))
        }
        Some(Budget::Granted { count, day }) => (count, day),
    };
    let lease = rates::lease(conn, name, want, now_us, horizon_us);
    let granted = match &lease {
        Ok(Lease::Granted { count, .. }) => *count,
        _ => 0,
    };
    if granted < want {
        give_back(conn, name, day, want - granted)?;
    }
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Warmup {
        // 200/d, ×1.5 a day, up to 100000/d.
        Warmup {
            name: "relay:x:25".into(),
            start_rate: 200.0 / 86_400.0,
            factor: 1.5,
            every_ms: 86_400_000,
            until_rate: 100_000.0 / 86_400.0,
            since_ms: 1_000_000,
            period: 0,
            used: 0,
        }
    }

    #[test]
    fn each_day_allows_start_times_factor_to_the_day_up_to_until() {
        let s = schedule();
        assert_eq!(s.allowance(0), 200);
        assert_eq!(s.allowance(1), 300);
        assert_eq!(s.allowance(2), 450);
        assert_eq!(s.last_day(), 16);
        assert_eq!(s.allowance(15), 87_578);
        assert_eq!(s.allowance(16), 100_000);
        assert_eq!(s.allowance(10_000), 100_000);
        assert_eq!(s.day_at(s.since_ms + 86_400_000 - 1), 0);
        assert_eq!(s.day_at(s.since_ms + 86_400_000), 1);
    }

    #[test]
    fn a_campaign_beyond_today_finishes_days_later() {
        let mut s = schedule();
        let now = s.since_ms + 3_600_000;
        s.used = 50;
        // 150 left today: 100 fit.
        assert_eq!(s.finish_after(100, now), None);
        // 150 today, 300 tomorrow, half of day 2's 450.
        let (after, day) = s.finish_after(150 + 300 + 225, now).unwrap();
        assert_eq!(day, 2);
        assert_eq!(after, s.day_start(2) + 43_200_000 - now);
        // A million: past day 16 at 100000 a day.
        let (_, day) = s.finish_after(1_000_000, now).unwrap();
        let before_16: i64 = 150 + (1..16).map(|k| s.allowance(k)).sum::<i64>();
        let expected = 16 + (1_000_000 - before_16 - 1) / 100_000;
        assert_eq!(day, expected);
    }
}
