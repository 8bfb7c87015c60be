//! The checks a job passes before anything is claimed: whose database it
//! is, the campaign's state and pause flag, its start time.

use super::{Cmd, Shared, BURY_PRIORITY, DB_RETRY_DELAY, FOREIGN_DELAY, RETRY_PRIORITY};
use crate::send_at;
use crate::store::{now_ms, CampaignState};
use crate::worker::fate::pause_delay;
use crate::worker::flags::CampaignInfo;

/// What to do with a job of another database: move it to that database's
/// own tube, where this worker never sees it again (released with
/// [`FOREIGN_DELAY`] if the id cannot name a tube or the move fails).
pub(in crate::worker) fn foreign(shared: &Shared, id: u64, db: String, body: &[u8]) -> Cmd {
    let first = shared
        .foreign
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(db.clone());
    let home = crate::queue::home_tube(&db);
    if first {
        tracing::warn!(
            job = id,
            database = %db,
            ours = %shared.identity.database_id,
            "job of another database in this tube: moving it, untouched, to that database's own tube mailsplit-<database> (logged once per database)"
        );
    }
    match home {
        Some(tube) => {
            shared
                .foreign_jobs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Cmd::Move {
                id,
                body: body.to_vec(),
                tube,
                delay: FOREIGN_DELAY,
            }
        }
        None => Cmd::Release {
            id,
            priority: 0,
            delay: FOREIGN_DELAY,
        },
    }
}

/// The campaign's state and pause flag decide first: a never-enqueued
/// draft's job is buried, a cancelled campaign's deleted, a paused one's
/// released with a delay.
pub(super) async fn check_flags(shared: &Shared, id: u64, info: &CampaignInfo) -> Result<(), Cmd> {
    if let Some(f) = shared.campaigns.flag_state(info.mail.id).await {
        if f.flags.state == CampaignState::Draft {
            // The cache may predate `enqueue`: ask the database.
            let fresh = fresh_flags(shared, id, info).await?;
            if fresh.is_none_or(|f| f.state == CampaignState::Draft) {
                tracing::warn!(
                    job = id,
                    campaign = %info.mail.name,
                    "burying job: its campaign is a draft that was never enqueued, so `mailsplit enqueue` did not put this job"
                );
                return Err(Cmd::Bury {
                    id,
                    priority: BURY_PRIORITY,
                });
            }
        }
        if f.flags.state == CampaignState::Cancelled {
            tracing::debug!(job = id, "campaign cancelled: deleting job");
            return Err(Cmd::Delete(id));
        }
        if f.flags.paused {
            return Err(Cmd::Release {
                id,
                priority: info.priority,
                delay: pause_delay(f.paused_since),
            });
        }
        if f.flags.before_start(now_ms()) {
            return before_start(shared, id, info).await;
        }
    }
    Ok(())
}

/// The campaign's flags read from the database now (not the cache); when
/// it cannot be read, the job goes back for [`DB_RETRY_DELAY`].
async fn fresh_flags(
    shared: &Shared,
    id: u64,
    info: &CampaignInfo,
) -> Result<Option<crate::store::campaigns::Flags>, Cmd> {
    shared
        .campaigns
        .fresh_flags(&shared.db, info.mail.id)
        .await
        .map_err(|e| {
            tracing::warn!(job = id, error = %e, "cannot read the campaign; job comes back in {DB_RETRY_DELAY:?}");
            Cmd::Release {
                id,
                priority: RETRY_PRIORITY,
                delay: DB_RETRY_DELAY,
            }
        })
}

/// A job of a campaign whose start time is still ahead as this worker's
/// flags say: asked of the database (an edit may have moved the start
/// earlier and kicked this job), then back with what is left of the wait
/// (at most an hour: one release per job per hour, never a loop).
async fn before_start(shared: &Shared, id: u64, info: &CampaignInfo) -> Result<(), Cmd> {
    let fresh = fresh_flags(shared, id, info).await?;
    match fresh.and_then(|f| send_at::wait(f.send_at, now_ms())) {
        Some(delay) => {
            tracing::debug!(job = id, campaign = %info.mail.name, ?delay, "campaign not started yet: job back until its start");
            Err(Cmd::Release {
                id,
                priority: info.priority,
                delay,
            })
        }
        None => Ok(()),
    }
}

/// What to do with a job naming a campaign that does not exist: delete
/// it if the campaign was deleted before its start (`campaign delete`),
/// else bury it (a campaign that never existed here).
pub(super) async fn unknown_campaign(shared: &Shared, id: u64, campaign: i64) -> Cmd {
    let deleted = shared
        .db
        .run(move |c| crate::store::drafts::was_deleted(c, campaign))
        .await;
    match deleted {
        Ok(true) => {
            tracing::info!(
                job = id,
                campaign,
                "campaign was deleted before its start: deleting its job"
            );
            Cmd::Delete(id)
        }
        Ok(false) => {
            tracing::warn!(
                job = id,
                "burying job: it names campaign {campaign}, which does not exist"
            );
            Cmd::Bury {
                id,
                priority: BURY_PRIORITY,
            }
        }
        Err(e) => {
            tracing::warn!(job = id, error = %e, "cannot read the campaign; job comes back in {DB_RETRY_DELAY:?}");
            Cmd::Release {
                id,
                priority: RETRY_PRIORITY,
                delay: DB_RETRY_DELAY,
            }
        }
    }
}
