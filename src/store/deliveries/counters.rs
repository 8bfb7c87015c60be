//! The campaign counters a batch of outcomes moves, and the observed rate
//! they carry, as one SQL `SET` both record paths share (the portable one
//! and PostgreSQL's single-statement one).

use std::sync::LazyLock;

use super::*;

/// Per-campaign counter deltas gathered while recording a batch.
#[derive(Default)]
pub(super) struct Delta {
    pub(super) sent: i64,
    pub(super) failed: i64,
    pub(super) skipped: i64,
    /// Failures after the batch's last success, for auto-pause.
    pub(super) trailing: i64,
    /// The batch's last failure reply, for the auto-pause reason.
    pub(super) last_error: Option<String>,
}

/// A gap between two outcomes longer than this is idle time (a pause), left
/// out of the rate: [`crate::campaign::status`] shows no rate after this long without
/// an outcome either.
pub fn idle_gap_ms() -> i64 {
    2 * super::rate_window_ms()
}

/// Move the counters and, every [`super::rate_window_ms`], the observed rate, in
/// one statement whose text never changes: each connection prepares it
/// once (see [`crate::store::prepared`]); the batch's figures are bound.
pub(super) fn bump_counters(
    conn: &mut Conn,
    campaign_id: i64,
    delta: &Delta,
    now: i64,
) -> Result<()> {
    static BUMP: LazyLock<String> = LazyLock::new(|| {
        let set = counters_set(
            "v.add_sent",
            "v.add_failed",
            "v.add_skipped",
            "v.add_trailing",
            "v.at_ms",
        );
        format!(
            "UPDATE campaign_counters SET {set} \
             FROM (SELECT ? AS add_sent, ? AS add_failed, ? AS add_skipped, \
                          ? AS add_trailing, ? AS at_ms) AS v \
             WHERE campaign_id = ?"
        )
    });
    let binds = || {
        vec![
            Bind::Int(delta.sent),
            Bind::Int(delta.failed),
            Bind::Int(delta.skipped),
            Bind::Int(delta.trailing),
            Bind::Int(now),
            Bind::Int(campaign_id),
        ]
    };
    on!(conn, |c| Prepared::new(&BUMP, binds()).execute(c))?;
    Ok(())
}

/// The `SET` clauses of the counters UPDATE for a batch that adds `sent`,
/// `failed` and `skipped` outcomes, `trailing` failures after its last
/// success, at time `now`. Each figure is an SQL expression: an integer, or
/// a value the same statement binds or computes (see [`record_sent_pg`]);
/// nothing from outside is formatted in, so no injection is possible, and
/// the arithmetic reads the same on both backends. In an UPDATE every
/// right-hand side reads the row as it was, so the new total is spelled out
/// as the old one plus this batch.
pub(super) fn counters_set(
    sent: &str,
    failed: &str,
    skipped: &str,
    trailing: &str,
    now: &str,
) -> String {
    let added = format!("({sent} + {failed} + {skipped})");
    // A stretch without outcomes longer than idle_gap_ms() (a pause, an
    // empty queue) is not sending time: the window's start moves past it,
    // so the rate after a resume counts only time spent sending.
    let (idle, window) = (idle_gap_ms(), super::rate_window_ms());
    let gap = format!(
        "(CASE WHEN last_at IS NOT NULL AND {now} - last_at > {idle} \
          THEN {now} - last_at ELSE 0 END)"
    );
    let start = format!("(window_at + {gap})");
    let due = format!("(window_at = 0 OR {start} <= {now} - {window})");
    let failures = autopause::counter_sql(sent, failed, trailing);
    format!(
        "sent = sent + {sent}, failed = failed + {failed}, skipped = skipped + {skipped}, \
         first_at = COALESCE(first_at, {now}), last_at = {now}, \
         rate = CASE WHEN {due} AND window_at > 0 \
           THEN (sent + failed + skipped + {added} - window_done) * 1000.0 / ({now} - {start}) \
           ELSE rate END, \
         window_done = CASE WHEN {due} THEN sent + failed + skipped + {added} ELSE window_done END, \
         window_at = CASE WHEN {due} THEN {now} WHEN window_at = 0 THEN 0 ELSE {start} END, \
         {failures}"
    )
}
