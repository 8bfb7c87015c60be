//! Keeping a long job alive: extend its ledger claims, and only when the
//! database confirmed them in time (see [`super::lease`]), touch the job on
//! our own clock (beanstalkd does not report DEADLINE_SOON while other jobs
//! are ready, issue 646). A worker cut from the database therefore stops
//! touching: its job returns to the queue when its TTR runs out, at the
//! time its claims lapse, and another worker carries on with it while this
//! one sends nothing more of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::reserve::Cmd;
use super::shared::Shared;
use super::tracker::Tracker;
use crate::queue::job_ttr;
use crate::store::deliveries;

/// After a failed extension, the next try comes this soon (the fence is
/// at most `job_ttr() - fence_margin()` away).
const RETRY_EXTEND: Duration = Duration::from_secs(1);

/// Runs until the job is finished.
pub async fn touch_loop(shared: Arc<Shared>, t: Arc<Tracker>) {
    let every = job_ttr() / 3;
    let mut wait = every;
    loop {
        tokio::select! {
            _ = t.done.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if t.lease.is_fenced() {
            // Its claims may be another worker's now: let the job go back.
            return;
        }
        let (campaign, token) = (t.campaign_id, t.token);
        let lease = job_ttr().as_millis() as i64;
        let asked = Instant::now();
        let extended = shared
            .db
            .run(move |c| deliveries::extend_claims(c, campaign, token, lease))
            .await;
        wait = match extended {
            Ok(_) if t.lease.extended(asked, Instant::now()) => {
                shared.cmd(t.server, Cmd::Touch(t.job_id));
                every
            }
            Ok(_) => {
                tracing::warn!(
                    job = t.job_id,
                    "claims extended too late (after this worker's fence): the job is no longer touched and goes back to the queue"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(job = t.job_id, error = %e, "cannot extend claims; not touching the job until they are");
                RETRY_EXTEND
            }
        };
    }
}
