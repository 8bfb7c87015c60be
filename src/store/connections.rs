//! Shared connection limits per relay: how many SMTP sessions all workers
//! together may hold open to `relay:HOST:PORT` (a relay's process limit, a
//! provider's per-IP cap). Each worker holds one lease row per limited relay
//! saying how many slots it has; it renews the row every few seconds with
//! what it uses and wants ([`lease`]), so the database sees one write per
//! worker per renewal, never one per session or message. A row whose
//! `until` has passed no longer counts: a crashed worker's slots come back
//! within [`LEASE_TTL_MS`].

use diesel::prelude::*;

use super::schema::connection_leases as l;
use super::schema::connection_limits as c;
use super::{now_ms, on, rates, Conn, Result};

/// How long a lease counts without being renewed (workers renew every 2 s).
pub const LEASE_TTL_MS: i64 = 10_000;

/// One limit, with the slots held under it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimit {
    pub name: String,
    pub connections: i64,
    /// Slots held by live leases.
    pub held: i64,
}

/// Set the connection limit of a relay group (`relay:HOST:PORT`).
pub fn set(conn: &mut Conn, name: &str, connections: i64) -> Result<()> {
    rates::check_name(name)?;
    let now = now_ms();
    on!(conn, |x| diesel::insert_into(c::table)
        .values((
            c::name.eq(name),
            c::connections.eq(connections),
            c::updated_at.eq(now),
        ))
        .on_conflict(c::name)
        .do_update()
        .set((c::connections.eq(connections), c::updated_at.eq(now)))
        .execute(x))?;
    Ok(())
}

/// Remove a limit and its leases; false when there was none.
pub fn delete(conn: &mut Conn, name: &str) -> Result<bool> {
    conn.transaction(|conn| {
        on!(conn, |x| diesel::delete(l::table.filter(l::name.eq(name)))
            .execute(x))?;
        Ok(on!(conn, |x| diesel::delete(c::table.find(name)).execute(x))? > 0)
    })
}

/// Every limit with the slots live leases hold.
pub fn list(conn: &mut Conn) -> Result<Vec<ConnectionLimit>> {
    let now = now_ms();
    let limits: Vec<(String, i64)> = on!(conn, |x| c::table
        .order(c::name)
        .select((c::name, c::connections))
        .load(x))?;
    let mut out = Vec::with_capacity(limits.len());
    for (name, connections) in limits {
        let slots: Vec<i64> = on!(conn, |x| l::table
            .filter(l::name.eq(&name))
            .filter(l::until.ge(now))
            .select(l::slots)
            .load(x))?;
        out.push(ConnectionLimit {
            name,
            connections,
            held: slots.iter().sum(),
        });
    }
    Ok(out)
}

/// What a lease renewal grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub limit: i64,
    /// Sessions this worker may have open until its next renewal (may be
    /// below what it has: then it opens none until enough have closed).
    pub allowed: i64,
}

/// Renew `owner`'s lease on `name`: it has `in_use` sessions open and would
/// like `want` (≥ `in_use`). It gets at most what the other live leases
/// leave free, and, while other workers wait for slots too, at most its fair
/// share (the limit over the workers that hold or want slots), so one
/// worker's sessions cannot keep the others out. `None` when the relay has
/// no limit (any lease row of `owner` is dropped).
///
/// One transaction that first writes the limit's row: it serialises the
/// renewals of one relay on both backends, so two workers never both take
/// the last free slot.
pub fn lease(
    conn: &mut Conn,
    name: &str,
    owner: &str,
    in_use: i64,
    want: i64,
    now: i64,
) -> Result<Option<Grant>> {
    conn.transaction(|conn| {
        let locked = on!(conn, |x| diesel::update(c::table.find(name))
            .set(c::updated_at.eq(c::updated_at))
            .execute(x))?;
        if locked == 0 {
            on!(conn, |x| diesel::delete(
                l::table.filter(l::name.eq(name)).filter(l::owner.eq(owner))
            )
            .execute(x))?;
            return Ok(None);
        }
        let limit: i64 = on!(conn, |x| c::table
            .find(name)
            .select(c::connections)
            .first(x))?;
        on!(conn, |x| diesel::delete(
            l::table.filter(l::name.eq(name)).filter(l::until.lt(now))
        )
        .execute(x))?;
        let others: Vec<(i64, i64)> = on!(conn, |x| l::table
            .filter(l::name.eq(name))
            .filter(l::owner.ne(owner))
            .select((l::slots, l::waiting))
            .load(x))?;
        let share = allot(limit, &others, in_use, want);
        let until = now + LEASE_TTL_MS;
        on!(conn, |x| diesel::insert_into(l::table)
            .values((
                l::name.eq(name),
                l::owner.eq(owner),
                l::slots.eq(share.slots),
                l::waiting.eq(share.waiting),
                l::until.eq(until),
            ))
            .on_conflict((l::name, l::owner))
            .do_update()
            .set((
                l::slots.eq(share.slots),
                l::waiting.eq(share.waiting),
                l::until.eq(until),
            ))
            .execute(x))?;
        let allowed = share.allowed;
        Ok(Some(Grant { limit, allowed }))
    })
}

/// What one renewal grants: `allowed` new-or-kept sessions, the `slots`
/// the lease holds (never fewer than those open), and how many more it
/// waits for.
#[derive(Debug, PartialEq, Eq)]
struct Share {
    allowed: i64,
    slots: i64,
    waiting: i64,
}

/// The decision of [`lease`], apart from the database: `others` are the
/// other live leases' (slots, waiting).
fn allot(limit: i64, others: &[(i64, i64)], in_use: i64, want: i64) -> Share {
    let others_hold: i64 = others.iter().map(|(s, _)| s).sum();
    let others_wait = others.iter().any(|&(_, w)| w > 0);
    let contenders = 1 + others.iter().filter(|&&(s, w)| s > 0 || w > 0).count() as i64;
    let share = if others_wait {
        (limit / contenders).max(1)
    } else {
        limit
    };
    let want = want.max(in_use);
    let allowed = want.min(share).min(limit - others_hold).max(0);
    Share {
        allowed,
        slots: allowed.max(in_use),
        waiting: (want - allowed).max(0),
    }
}

/// A worker stops: its slots are free at once.
pub fn release(conn: &mut Conn, name: &str, owner: &str) -> Result<()> {
    on!(conn, |x| diesel::delete(
        l::table.filter(l::name.eq(name)).filter(l::owner.eq(owner))
    )
    .execute(x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{allot, Share};

    #[test]
    fn alone_a_worker_may_take_the_whole_limit() {
        let s = allot(10, &[], 0, 25);
        assert_eq!(
            s,
            Share {
                allowed: 10,
                slots: 10,
                waiting: 15
            }
        );
    }

    #[test]
    fn with_others_waiting_a_worker_gets_its_fair_share_of_what_is_free() {
        // Two others: one holds 6 and waits for more, one holds 0 and waits.
        let s = allot(12, &[(6, 4), (0, 5)], 0, 10);
        assert_eq!(s.allowed, 4, "12 over 3 contenders");
        // Only 2 are free when the others hold 10.
        assert_eq!(allot(12, &[(10, 1)], 0, 10).allowed, 2);
    }

    #[test]
    fn open_sessions_are_never_taken_away() {
        // Its fair share is 5 but 8 are open: the lease keeps 8 slots.
        let s = allot(10, &[(2, 3)], 8, 8);
        assert_eq!((s.allowed, s.slots), (5, 8));
        let s = allot(10, &[(10, 0)], 3, 3);
        assert_eq!(
            s,
            Share {
                allowed: 0,
                slots: 3,
                waiting: 3
            }
        );
    }
}
