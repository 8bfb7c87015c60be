//! Keeping a long job alive: touch it on our own clock (beanstalkd does not
//! report DEADLINE_SOON while other jobs are ready, issue 646) and extend
//! its ledger claims to match.

use std::sync::Arc;

use super::fate::Tracker;
use super::pipeline::Shared;
use super::reserve::Cmd;
use crate::queue::JOB_TTR;
use crate::store::deliveries;

/// Runs until the job is finished.
pub async fn touch_loop(shared: Arc<Shared>, t: Arc<Tracker>) {
    let every = JOB_TTR / 3;
    loop {
        tokio::select! {
            _ = t.done.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        shared.cmd(t.server, Cmd::Touch(t.job_id));
        let (campaign, token) = (t.campaign_id, t.token);
        let lease = JOB_TTR.as_millis() as i64;
        if let Err(e) = shared
            .db
            .run(move |c| deliveries::extend_claims(c, campaign, token, lease))
            .await
        {
            tracing::warn!(job = t.job_id, error = %e, "cannot extend claims");
        }
    }
}
