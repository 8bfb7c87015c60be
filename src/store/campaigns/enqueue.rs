//! A campaign's enqueue run: the lease one splitter holds while it
//! works, and each step's intent/confirm bookkeeping that makes a crashed
//! run safe to resume.

use diesel::prelude::*;

use super::{transition, CampaignState};
use crate::store::schema::{campaign_counters as cc, campaigns, deliveries};
use crate::store::{now_ms, on, Conn, DeliveryState, Result, StoreError};

/// Mark the start of an enqueue run (draft → enqueuing). The recipient
/// count becomes the list's size now (`list_size`: it may have grown since
/// the campaign was created). A campaign that is no draft is left alone.
pub fn start_enqueue(conn: &mut Conn, campaign_id: i64, list_size: i64) -> Result<()> {
    conn.transaction(|conn| {
        if transition(
            conn,
            campaign_id,
            CampaignState::Draft,
            CampaignState::Enqueuing,
        )? == 1
        {
            on!(conn, |c| diesel::update(cc::table.find(campaign_id))
                .set(cc::recipients.eq(list_size))
                .execute(c))?;
        }
        Ok(())
    })
}

/// How long an `enqueue` run holds its campaign without renewing: a run
/// killed with -9 blocks the next one this long at most. Every step of a
/// live run renews it: one per page of the list, many times a second.
pub const ENQUEUE_LEASE_MS: i64 = 30_000;

/// Who holds a campaign's enqueue lease, when another run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The run's description (pid, host, run id).
    pub owner: String,
    /// When the lease runs out unless renewed (ms).
    pub until: i64,
}

/// Take the campaign for the `enqueue` run `owner` if nobody holds it, or
/// its holder's lease ran out. `Ok(None)`: taken; `Ok(Some(holder))`: a
/// live run holds it.
pub fn take_enqueue_lease(
    conn: &mut Conn,
    campaign_id: i64,
    owner: &str,
) -> Result<Option<LeaseHolder>> {
    let now = now_ms();
    let taken = on!(conn, |c| diesel::update(
        campaigns::table.find(campaign_id).filter(
            campaigns::enqueue_owner
                .is_null()
                .or(campaigns::enqueue_lease_until.lt(now))
                .or(campaigns::enqueue_owner.eq(owner))
        )
    )
    .set((
        campaigns::enqueue_owner.eq(owner),
        campaigns::enqueue_lease_until.eq(now + ENQUEUE_LEASE_MS),
    ))
    .execute(c))?;
    if taken == 1 {
        return Ok(None);
    }
    let held: Option<(Option<String>, Option<i64>)> = on!(conn, |c| campaigns::table
        .find(campaign_id)
        .select((campaigns::enqueue_owner, campaigns::enqueue_lease_until))
        .first(c)
        .optional())?;
    match held {
        Some((Some(owner), until)) => Ok(Some(LeaseHolder {
            owner,
            until: until.unwrap_or(now),
        })),
        // Released between the two statements: try again at once.
        Some((None, _)) => take_enqueue_lease(conn, campaign_id, owner),
        None => Err(StoreError::UnknownCampaign(campaign_id.to_string())),
    }
}

/// Take the campaign from `holder`, a run known to be dead (its process is
/// gone), without waiting for its lease to run out; false if `holder` no
/// longer holds it. Safe even if that judgement were wrong: the holder's
/// next step would fail and change nothing (see [`enqueue_step`]).
pub fn take_enqueue_lease_from(
    conn: &mut Conn,
    campaign_id: i64,
    owner: &str,
    holder: &str,
) -> Result<bool> {
    let taken = on!(conn, |c| diesel::update(
        campaigns::table
            .find(campaign_id)
            .filter(campaigns::enqueue_owner.eq(holder))
    )
    .set((
        campaigns::enqueue_owner.eq(owner),
        campaigns::enqueue_lease_until.eq(now_ms() + ENQUEUE_LEASE_MS),
    ))
    .execute(c))?;
    Ok(taken == 1)
}

/// Push back `owner`'s lease; [`StoreError::LeaseLost`] when another run
/// holds the campaign now.
pub fn renew_enqueue_lease(conn: &mut Conn, campaign_id: i64, owner: &str) -> Result<()> {
    let renewed = on!(conn, |c| diesel::update(
        campaigns::table
            .find(campaign_id)
            .filter(campaigns::enqueue_owner.eq(owner))
    )
    .set(campaigns::enqueue_lease_until.eq(now_ms() + ENQUEUE_LEASE_MS))
    .execute(c))?;
    if renewed == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(campaign_id.to_string()))
    }
}

/// Give the campaign up if `owner` still holds it (a no-op otherwise).
pub fn release_enqueue_lease(conn: &mut Conn, campaign_id: i64, owner: &str) -> Result<()> {
    on!(conn, |c| diesel::update(
        campaigns::table
            .find(campaign_id)
            .filter(campaigns::enqueue_owner.eq(owner))
    )
    .set((
        campaigns::enqueue_owner.eq(None::<String>),
        campaigns::enqueue_lease_until.eq(None::<i64>),
    ))
    .execute(c))?;
    Ok(())
}

/// Whether `owner` holds the campaign's lease now.
pub fn holds_enqueue_lease(conn: &mut Conn, campaign_id: i64, owner: &str) -> Result<bool> {
    let held: Option<Option<String>> = on!(conn, |c| campaigns::table
        .find(campaign_id)
        .select(campaigns::enqueue_owner)
        .first(c)
        .optional())?;
    Ok(held.flatten().as_deref() == Some(owner))
}

/// A window of jobs about to be put into beanstalkd: every active member
/// of the list after the enqueue cursor up to `upto`. Recorded before the
/// window's first put; if the process dies before the window is confirmed,
/// the next run looks for its jobs on each server above the job id it had
/// then (ids only grow) and in the ledger, and puts only what is in
/// neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub upto: i64,
    /// Each server (`host:port`) with its newest job id before the window.
    pub servers: Vec<(String, u64)>,
}

impl Intent {
    /// The servers as stored: `ADDR AFTER_JOB` separated by commas.
    pub fn servers_text(&self) -> String {
        self.servers
            .iter()
            .map(|(addr, after)| format!("{addr} {after}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Read [`Intent::servers_text`] back; `None` if malformed.
    pub fn parse(upto: i64, text: &str) -> Option<Intent> {
        let servers = text
            .split(',')
            .map(|entry| {
                let (addr, after) = entry.trim().rsplit_once(' ')?;
                Some((addr.to_string(), after.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Intent { upto, servers })
    }
}

/// Recipients now covered by the cursor: a put job (if any) and the
/// unsubscribed recipients recorded as skipped up to `cursor`.
#[derive(Debug, Clone, Default)]
pub struct Confirm {
    pub cursor: i64,
    pub enqueued: i64,
    pub jobs: i64,
    pub skipped: Vec<i64>,
}

/// Advance the enqueue cursor and/or record the next intent, in one
/// transaction, so the cursor never passes what was really put; renew the
/// lease of the run `owner` in the same transaction. If another run holds
/// the campaign now, nothing changes and the step fails (see
/// [`step_sql`]); the caller asks [`holds_enqueue_lease`] why.
pub fn enqueue_step(
    conn: &mut Conn,
    campaign_id: i64,
    owner: &str,
    confirm: Option<&Confirm>,
    intent: Option<&Intent>,
) -> Result<()> {
    let now = now_ms();
    let skipped = confirm.map_or(&[][..], |c| &c.skipped[..]);
    let step = Step {
        campaign_id,
        owner,
        confirm,
        intent,
        now,
    };
    if skipped.is_empty() {
        return conn.execute_atomic(&step.sql(0));
    }
    // Recipients not active at enqueue: recorded as skipped in the ledger,
    // counted by the rows really inserted (a re-run inserts none twice).
    conn.transaction(|conn| {
        let mut added = 0i64;
        for chunk in skipped.chunks(500) {
            let rows: Vec<_> = chunk
                .iter()
                .map(|&rid| {
                    (
                        deliveries::campaign_id.eq(campaign_id),
                        deliveries::recipient_id.eq(rid),
                        deliveries::state.eq(DeliveryState::Skipped),
                        deliveries::last_error.eq(Some("not active at enqueue")),
                        deliveries::updated_at.eq(now),
                    )
                })
                .collect();
            added += on!(conn, |c| diesel::insert_into(deliveries::table)
                .values(&rows)
                .on_conflict_do_nothing()
                .execute(c))? as i64;
        }
        conn.execute_atomic(&step.sql(added))
    })
}

/// One enqueue step, see [`enqueue_step`].
struct Step<'a> {
    campaign_id: i64,
    owner: &'a str,
    confirm: Option<&'a Confirm>,
    intent: Option<&'a Intent>,
    now: i64,
}

/// A string as an SQL literal.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Step<'_> {
    /// The updates of one enqueue step as one SQL text: it runs once per
    /// job, so it goes in one round trip. Only integers and the quoted
    /// owner and server address are formatted in.
    fn sql(&self, skipped: i64) -> String {
        let campaign_id = self.campaign_id;
        let mut sql = String::new();
        if let Some(done) = self.confirm {
            // `recipients` never falls below what is enqueued or skipped
            // (members imported during the run), so `pending` never goes
            // negative.
            sql.push_str(&format!(
                "UPDATE campaign_counters SET enqueued = enqueued + {enqueued}, jobs = jobs + {jobs}, \
                 skipped = skipped + {skipped}, enqueue_skipped = enqueue_skipped + {skipped}, \
                 recipients = CASE WHEN recipients < enqueued + enqueue_skipped + {covered} \
                   THEN enqueued + enqueue_skipped + {covered} ELSE recipients END \
                 WHERE campaign_id = {campaign_id}; ",
                enqueued = done.enqueued,
                jobs = done.jobs,
                covered = done.enqueued + skipped,
            ));
        }
        let cursor = self
            .confirm
            .map_or_else(|| "enqueue_cursor".to_string(), |c| c.cursor.to_string());
        let (upto, servers) = match self.intent {
            Some(i) => (i.upto.to_string(), quoted(&i.servers_text())),
            None => ("NULL".into(), "NULL".into()),
        };
        // The campaign row in one statement, guarded by the lease: renewed
        // if this run holds it. If another run took the campaign over (this
        // one stalled past its lease), the CASE yields NULL, which the NOT
        // NULL column refuses: the statement fails, the whole step rolls
        // back (counters too), and a stale run can never move the cursor or
        // the counters. No extra statement, no extra round trip.
        sql.push_str(&format!(
            "UPDATE campaigns SET \
             enqueue_cursor = CASE WHEN enqueue_owner = {owner} THEN {cursor} END, \
             enqueue_lease_until = {until}, pending_upto = {upto}, pending_servers = {servers}, \
             updated_at = {now} WHERE id = {campaign_id}",
            owner = quoted(self.owner),
            until = self.now + ENQUEUE_LEASE_MS,
            now = self.now,
        ));
        sql
    }
}

/// Enqueue reached the end of the list: the recipient count becomes exact,
/// the campaign queued, and the run `owner` gives it up.
pub fn finish_enqueue(conn: &mut Conn, campaign_id: i64, owner: &str) -> Result<()> {
    conn.transaction(|conn| {
        let finished = on!(conn, |c| diesel::update(
            campaigns::table
                .find(campaign_id)
                .filter(campaigns::state.eq(CampaignState::Enqueuing))
                .filter(campaigns::enqueue_owner.eq(owner))
        )
        .set((
            campaigns::state.eq(CampaignState::Queued),
            campaigns::enqueue_owner.eq(None::<String>),
            campaigns::enqueue_lease_until.eq(None::<i64>),
            campaigns::updated_at.eq(now_ms()),
        ))
        .execute(c))?;
        if finished == 0 && !holds_enqueue_lease(conn, campaign_id, owner)? {
            return Err(StoreError::LeaseLost(campaign_id.to_string()));
        }
        on!(conn, |c| diesel::update(cc::table.find(campaign_id))
            .set(cc::recipients.eq(cc::enqueued + cc::enqueue_skipped))
            .execute(c))?;
        Ok(())
    })
}
