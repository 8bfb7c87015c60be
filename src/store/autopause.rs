//! Auto-pause (listmonk's `max_send_errors`): a relay that answers 5xx to
//! everything (a wrong relay, an expired account, a blocked IP) must not
//! mark a million recipients failed. Every batch of outcomes moves, in the
//! same UPDATE as the counters, a streak of failures since the last
//! success and two buckets of [`BUCKET`] outcomes; when a batch had
//! failures, [`check`] pauses the campaign if the streak reached
//! [`FAILURE_STREAK_LIMIT`] or the failure rate over the last 250 to 500
//! outcomes passed the campaign's `max_failure_rate`, and stores why.
//! The worker whose batch paused it learns so from
//! [`super::deliveries::record_batch`] and stops at once; other workers
//! look again after their next batch with failures, or at their next flag
//! refresh. A resume clears the record ([`forget`]) so the campaign is
//! judged afresh after the fix.
//!
//! The complaint guard ([`check_complaints`]) is the same stop for readers
//! marking the campaign as spam: once [`MIN_DELIVERED`] messages are
//! delivered, complaints over the campaign's `max_complaint_rate` of them
//! (Gmail's and Yahoo's bulk-sender limit by default) pause it, in the
//! transaction that records the complaint. Either pause is reported to
//! webhooks as `campaign.paused`.

use diesel::prelude::*;

use super::schema::{campaign_counters as cc, campaigns};
use super::{on, outbox, CampaignState, Conn, Result};

/// Permanent failures in a row that pause a campaign whatever its rate.
pub const FAILURE_STREAK_LIMIT: i64 = 100;
/// Outcomes per bucket: the rate is judged over the current bucket and the
/// one before, i.e. the last 250 to 500 messages.
pub const BUCKET: i64 = 250;
/// Fewer outcomes than this say nothing about a rate.
pub const MIN_SAMPLE: i64 = 100;
/// `campaign create`'s default `--max-failure-rate`.
pub const DEFAULT_MAX_FAILURE_RATE: f64 = 0.2;
/// `campaign create`'s default `--max-complaint-rate`: 0.3 %, the spam
/// rate Gmail and Yahoo hold bulk senders under.
pub const DEFAULT_MAX_COMPLAINT_RATE: f64 = 0.003;
/// Delivered messages before complaints are judged: three complaints in
/// the first hundred say little, and the providers judge volume.
pub const MIN_DELIVERED: i64 = 1_000;

/// The `SET` clauses that move the streak and the buckets for a batch of
/// `sent` successes and `failed` failures, `trailing` of them after the
/// batch's last success (in the order the outcomes came; only meaningful
/// when `sent > 0`). Appended to the counters UPDATE, where every
/// right-hand side reads the row as it was. Each figure is an SQL
/// expression: an integer, or a count the same statement computes; never
/// text from outside.
pub(crate) fn counter_sql(sent: &str, failed: &str, trailing: &str) -> String {
    let done = format!("({sent} + {failed})");
    let roll = format!("recent_done + {done} >= {BUCKET}");
    format!(
        "fail_streak = CASE WHEN {sent} > 0 THEN {trailing} ELSE fail_streak + {failed} END, \
         prior_done = CASE WHEN {roll} THEN recent_done + {done} ELSE prior_done END, \
         prior_failed = CASE WHEN {roll} THEN recent_failed + {failed} ELSE prior_failed END, \
         recent_done = CASE WHEN {roll} THEN 0 ELSE recent_done + {done} END, \
         recent_failed = CASE WHEN {roll} THEN 0 ELSE recent_failed + {failed} END"
    )
}

/// Why a campaign with this record should stop, if it should.
pub fn verdict(
    max_rate: Option<f64>,
    streak: i64,
    done: i64,
    failed: i64,
    last_error: Option<&str>,
) -> Option<String> {
    let max_rate = max_rate?;
    let last = last_error
        .map(|e| format!("; last failure: {}", super::clip_line(e, 200)))
        .unwrap_or_default();
    if streak >= FAILURE_STREAK_LIMIT {
        return Some(format!("auto-paused: {streak} failures in a row{last}"));
    }
    if done >= MIN_SAMPLE && failed as f64 > max_rate * done as f64 {
        return Some(format!(
            "auto-paused: {failed} of the last {done} messages failed ({:.0} %, limit {:.0} %){last}",
            100.0 * failed as f64 / done as f64,
            100.0 * max_rate
        ));
    }
    None
}

/// Why a campaign with `complaints` over `delivered` messages should stop,
/// if it should.
pub fn complaint_verdict(max_rate: Option<f64>, delivered: i64, complaints: i64) -> Option<String> {
    let max_rate = max_rate?;
    if delivered < MIN_DELIVERED || complaints as f64 <= max_rate * delivered as f64 {
        return None;
    }
    Some(format!(
        "auto-paused: {complaints} complaints of {delivered} delivered ({:.2} %, limit {:.2} %); readers mark it as spam: look at the list's consent and the content before `mailsplit resume`",
        100.0 * complaints as f64 / delivered as f64,
        100.0 * max_rate
    ))
}

/// Pause the campaign if its complaints say so (see [`complaint_verdict`]),
/// in the caller's transaction; returns the reason when this call paused
/// it.
pub fn check_complaints(conn: &mut Conn, campaign_id: i64, now: i64) -> Result<Option<String>> {
    type Row = (Option<f64>, bool, CampaignState, i64, i64);
    let row: Option<Row> = on!(conn, |c| campaigns::table
        .inner_join(cc::table)
        .filter(campaigns::id.eq(campaign_id))
        .select((
            campaigns::max_complaint_rate,
            campaigns::paused,
            campaigns::state,
            cc::sent,
            cc::complaints,
        ))
        .first(c)
        .optional())?;
    let Some((max_rate, paused, state, sent, complaints)) = row else {
        return Ok(None);
    };
    if paused || state == CampaignState::Cancelled {
        return Ok(None);
    }
    match complaint_verdict(max_rate, sent, complaints) {
        Some(reason) => pause(conn, campaign_id, reason, now),
        None => Ok(None),
    }
}

/// Pause a campaign that is not paused, with `reason`, and tell the
/// webhooks (`campaign.paused`); the reason when this call paused it.
fn pause(conn: &mut Conn, campaign_id: i64, reason: String, now: i64) -> Result<Option<String>> {
    let changed = on!(conn, |c| diesel::update(
        campaigns::table
            .find(campaign_id)
            .filter(campaigns::paused.eq(false))
    )
    .set((
        campaigns::paused.eq(true),
        campaigns::pause_reason.eq(Some(&reason)),
        campaigns::updated_at.eq(now),
    ))
    .execute(c))?;
    if changed != 1 {
        return Ok(None);
    }
    outbox::record(
        conn,
        &[outbox::NewEvent {
            kind: outbox::EventKind::CampaignPaused,
            campaign_id: Some(campaign_id),
            recipient_id: None,
            at: now,
            link: None,
            link_url: None,
        }],
    )?;
    Ok(Some(reason))
}

/// Pause the campaign if its failure record says so; returns the reason
/// when this call paused it (a campaign already paused or cancelled is left
/// as it is).
pub fn check(
    conn: &mut Conn,
    campaign_id: i64,
    last_error: Option<&str>,
    now: i64,
) -> Result<Option<String>> {
    type Row = (Option<f64>, bool, CampaignState, i64, i64, i64, i64, i64);
    let row: Option<Row> = on!(conn, |c| campaigns::table
        .inner_join(cc::table)
        .filter(campaigns::id.eq(campaign_id))
        .select((
            campaigns::max_failure_rate,
            campaigns::paused,
            campaigns::state,
            cc::fail_streak,
            cc::prior_done,
            cc::prior_failed,
            cc::recent_done,
            cc::recent_failed,
        ))
        .first(c)
        .optional())?;
    let Some((max_rate, paused, state, streak, pd, pf, rd, rf)) = row else {
        return Ok(None);
    };
    if paused || state == CampaignState::Cancelled {
        return Ok(None);
    }
    match verdict(max_rate, streak, pd + rd, pf + rf, last_error) {
        Some(reason) => pause(conn, campaign_id, reason, now),
        None => Ok(None),
    }
}

/// Clear a campaign's failure record (on resume).
pub fn forget(conn: &mut Conn, campaign_id: i64) -> Result<()> {
    on!(conn, |c| diesel::update(cc::table.find(campaign_id))
        .set((
            cc::fail_streak.eq(0),
            cc::recent_done.eq(0),
            cc::recent_failed.eq(0),
            cc::prior_done.eq(0),
            cc::prior_failed.eq(0),
        ))
        .execute(c))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        // Off: never.
        assert_eq!(verdict(None, 10_000, 500, 500, None), None);
        // A streak pauses whatever the rate.
        assert!(verdict(
            Some(0.9),
            FAILURE_STREAK_LIMIT,
            1_000,
            100,
            Some("554 5.7.1 no")
        )
        .unwrap()
        .contains("100 failures in a row; last failure: 554 5.7.1 no"));
        // Too few outcomes to judge a rate.
        assert_eq!(
            verdict(Some(0.2), 0, MIN_SAMPLE - 1, MIN_SAMPLE - 1, None),
            None
        );
        // At the limit is fine, above it is not.
        assert_eq!(verdict(Some(0.2), 0, 500, 100, None), None);
        assert!(verdict(Some(0.2), 0, 500, 101, None)
            .unwrap()
            .contains("101 of the last 500 messages failed (20 %, limit 20 %)"));
    }

    #[test]
    fn complaint_verdicts() {
        let limit = Some(DEFAULT_MAX_COMPLAINT_RATE);
        // Off, or too few delivered to judge.
        assert_eq!(complaint_verdict(None, 10_000, 5_000), None);
        assert_eq!(complaint_verdict(limit, MIN_DELIVERED - 1, 500), None);
        // 3 of 1,000 is at the limit; 4 is over it.
        assert_eq!(complaint_verdict(limit, 1_000, 3), None);
        let why = complaint_verdict(limit, 1_000, 4).unwrap();
        assert!(
            why.contains("4 complaints of 1000 delivered (0.40 %, limit 0.30 %)"),
            "{why}"
        );
    }
}
