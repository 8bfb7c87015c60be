//! When a PostgreSQL connection may keep one plan per prepared statement.
//!
//! Every connection starts with `plan_cache_mode = force_custom_plan` (see
//! [`Conn::open_with`]): the ledger grows from empty during a campaign, and
//! a generic plan made while `deliveries` held a few hundred rows is a
//! sequential scan joined by hash, kept for the connection's life as the
//! table grows to millions. The generic plan of the batch of successes
//! turns from a sequential scan into a primary-key probe at a small table
//! size (BENCHMARKS.md, "Measurements behind the code's choices").
//!
//! Planning each execution costs, though: about as much as running the
//! hot statements, a large share of the server's CPU during a campaign.
//!
//! So a worker's connection switches to generic plans while `deliveries`
//! is past [`LARGE_LEDGER_BYTES`], forty times the size where the plans
//! turn into probes. There each hot statement is planned once per
//! connection, and the plan stays right as the table grows. A table made
//! small again (`TRUNCATE`, `VACUUM FULL`) would be planned again small:
//! the size is looked at again every [`CHECK_EVERY`], and the connection
//! goes back to custom plans if it is under the mark.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Text};

use super::{Conn, Inner, Result};

/// `deliveries` at least this large (8 MiB, about 45,000 rows) plans as
/// probes with a wide margin.
const LARGE_LEDGER_BYTES: i64 = 8 << 20;
/// A connection looks at the ledger's size at most this often.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Every PostgreSQL connection's planning until it is told otherwise.
pub(super) const CUSTOM_PLANS: &str = "SET plan_cache_mode = force_custom_plan";

/// Whether a connection plans each execution or keeps generic plans.
#[derive(Debug, Default)]
pub(super) struct PlanMode {
    generic: bool,
    checked: Option<Instant>,
}

impl Conn {
    /// On PostgreSQL, keep generic plans while the ledger is large (see the
    /// module's notes). Looks at most every [`CHECK_EVERY`], and never
    /// inside a transaction; a no-op on SQLite. Returns whether this
    /// connection keeps generic plans now.
    pub fn generic_plans_while_large(&mut self) -> Result<bool> {
        let Inner::Pg(c) = &mut self.inner else {
            return Ok(false);
        };
        let mode = &mut self.plans;
        if self.depth > 0 || mode.checked.is_some_and(|t| t.elapsed() < CHECK_EVERY) {
            return Ok(mode.generic);
        }
        mode.checked = Some(Instant::now());
        let large: bool = diesel::select(
            sql::<Bool>("pg_relation_size('deliveries') >= ").bind::<BigInt, _>(LARGE_LEDGER_BYTES),
        )
        .get_result(c)?;
        if large != mode.generic {
            c.batch_execute(if large {
                // Plans made while the table was small (before a `TRUNCATE`
                // went by, say) go: each statement is planned afresh.
                "DISCARD PLANS; SET plan_cache_mode = force_generic_plan"
            } else {
                CUSTOM_PLANS
            })?;
            mode.generic = large;
        }
        Ok(mode.generic)
    }

    /// What the server says `plan_cache_mode` is for this connection
    /// (`None` on SQLite, which has no such setting).
    pub fn plan_cache_mode(&mut self) -> Result<Option<String>> {
        let Inner::Pg(c) = &mut self.inner else {
            return Ok(None);
        };
        let mode: String =
            diesel::select(sql::<Text>("current_setting('plan_cache_mode')")).get_result(c)?;
        Ok(Some(mode))
    }
}
