//! Campaigns, their state machine, the pause flag and the O(1) counters.

use diesel::prelude::*;

mod enqueue;

pub use enqueue::*;

use super::schema::{campaign_counters as cc, campaigns};
use super::{now_ms, on, Conn, Result, StoreError};

text_enum! {
    /// The stored lifecycle of a campaign. Pausing is a separate boolean
    /// column (`campaigns.paused`) so it can be flipped by hand with one
    /// UPDATE.
    pub enum CampaignState ("campaign state") {
        /// Created, nothing enqueued yet.
        Draft = "draft",
        /// `enqueue` started and has not finished (or crashed; run it again).
        Enqueuing = "enqueuing",
        /// Every recipient is in a job; workers are sending.
        Queued = "queued",
        /// Cancelled: workers delete its remaining jobs.
        Cancelled = "cancelled",
    }
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = campaigns)]
pub struct Campaign {
    pub id: i64,
    pub name: String,
    pub list_id: i64,
    pub template: String,
    pub subject: String,
    pub from_addr: String,
    pub priority: i64,
    pub state: CampaignState,
    pub paused: bool,
    pub enqueue_cursor: i64,
    /// The in-doubt window of an interrupted enqueue run (see [`Intent`]):
    /// its last recipient id, and its servers as [`Intent::servers_text`].
    pub pending_upto: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Base of the one-click unsubscribe links (`<public_url>/u/TOKEN`).
    pub public_url: Option<String>,
    /// VERP return path (`local@domain`; each message's envelope sender
    /// becomes `local+TOKEN@domain`).
    pub return_path: Option<String>,
    /// Failure rate (0..1) above which workers pause the campaign; `None`:
    /// never (see [`super::autopause`]).
    pub max_failure_rate: Option<f64>,
    /// Why the workers paused it (cleared by a resume).
    pub pause_reason: Option<String>,
    /// The `enqueue` run holding the campaign, and until when (ms).
    pub enqueue_owner: Option<String>,
    pub enqueue_lease_until: Option<i64>,
    pub pending_servers: Option<String>,
    /// When it may start (ms since the epoch); `None`: as soon as it is
    /// enqueued. Workers send nothing before it.
    pub send_at: Option<i64>,
    /// Complaints per delivered message that pause it; `None`: never.
    pub max_complaint_rate: Option<f64>,
}

impl Campaign {
    /// The intent an interrupted enqueue run left, if any. A malformed
    /// record (written by hand) is an error, never a silent "nothing in
    /// doubt", which could skip recipients.
    pub fn pending_intent(&self) -> Result<Option<Intent>> {
        match (self.pending_upto, self.pending_servers.as_deref()) {
            (Some(upto), Some(text)) => {
                Intent::parse(upto, text)
                    .map(Some)
                    .ok_or_else(|| StoreError::BadValue {
                        what: "enqueue intent (ADDR AFTER_JOB, ...)",
                        value: text.to_string(),
                    })
            }
            _ => Ok(None),
        }
    }
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = cc)]
pub struct Counters {
    pub campaign_id: i64,
    pub recipients: i64,
    pub enqueued: i64,
    pub jobs: i64,
    pub sent: i64,
    pub failed: i64,
    pub skipped: i64,
    pub enqueue_skipped: i64,
    pub window_at: i64,
    pub window_done: i64,
    pub rate: f64,
    pub first_at: Option<i64>,
    pub last_at: Option<i64>,
    /// Sent messages reported bounced (at send time with 5.1.x, or by a
    /// later report): `COUNT(*)` of the ledger's `bounced_at`.
    pub bounced: i64,
    /// Sent messages that drew a complaint: `COUNT(*)` of `complained_at`.
    pub complaints: i64,
    /// Auto-pause bookkeeping (see [`super::autopause`]).
    pub fail_streak: i64,
    pub recent_done: i64,
    pub recent_failed: i64,
    pub prior_done: i64,
    pub prior_failed: i64,
}

impl Counters {
    pub fn done(&self) -> i64 {
        self.sent + self.failed + self.skipped
    }
    pub fn pending(&self) -> i64 {
        self.recipients - self.done()
    }
}

pub struct NewCampaign<'a> {
    pub name: &'a str,
    pub list_id: i64,
    pub template: &'a str,
    pub subject: &'a str,
    pub from_addr: &'a str,
    pub priority: i64,
    /// Members of the list now; replaced by the exact figure when enqueue ends.
    pub recipients: i64,
    pub public_url: Option<&'a str>,
    pub return_path: Option<&'a str>,
    /// See [`Campaign::max_failure_rate`].
    pub max_failure_rate: Option<f64>,
    /// Complaints per delivered message that pause it (see
    /// [`super::autopause::check_complaints`]); `None`: never.
    pub max_complaint_rate: Option<f64>,
    /// See [`Campaign::send_at`].
    pub send_at: Option<i64>,
}

/// Create a campaign and its counter row in one transaction.
pub fn create(conn: &mut Conn, new: &NewCampaign) -> Result<Campaign> {
    let now = now_ms();
    conn.transaction(|conn| {
        let inserted = on!(conn, |c| diesel::insert_into(campaigns::table)
            .values((
                campaigns::name.eq(new.name),
                campaigns::list_id.eq(new.list_id),
                campaigns::template.eq(new.template),
                campaigns::subject.eq(new.subject),
                campaigns::from_addr.eq(new.from_addr),
                campaigns::priority.eq(new.priority),
                campaigns::public_url.eq(new.public_url),
                campaigns::return_path.eq(new.return_path),
                campaigns::max_failure_rate.eq(new.max_failure_rate),
                campaigns::max_complaint_rate.eq(new.max_complaint_rate),
                campaigns::send_at.eq(new.send_at),
                campaigns::state.eq(CampaignState::Draft),
                campaigns::created_at.eq(now),
                campaigns::updated_at.eq(now),
            ))
            .on_conflict(campaigns::name)
            .do_nothing()
            .execute(c))?;
        if inserted == 0 {
            return Err(StoreError::CampaignExists(new.name.to_string()));
        }
        let campaign = find(conn, new.name)?;
        on!(conn, |c| diesel::insert_into(cc::table)
            .values((
                cc::campaign_id.eq(campaign.id),
                cc::recipients.eq(new.recipients),
            ))
            .execute(c))?;
        Ok(campaign)
    })
}

/// A campaign by name, or by numeric id when no campaign has that name.
pub fn find(conn: &mut Conn, name_or_id: &str) -> Result<Campaign> {
    let by_name: Option<Campaign> = on!(conn, |c| campaigns::table
        .filter(campaigns::name.eq(name_or_id))
        .select(Campaign::as_select())
        .first(c)
        .optional())?;
    if let Some(found) = by_name {
        return Ok(found);
    }
    if let Ok(id) = name_or_id.parse::<i64>() {
        if let Some(found) = get(conn, id)? {
            return Ok(found);
        }
    }
    Err(StoreError::UnknownCampaign(name_or_id.to_string()))
}

pub fn get(conn: &mut Conn, id: i64) -> Result<Option<Campaign>> {
    Ok(on!(conn, |c| campaigns::table
        .find(id)
        .select(Campaign::as_select())
        .first(c)
        .optional())?)
}

/// Every campaign with its counters, oldest first.
pub fn list(conn: &mut Conn) -> Result<Vec<(Campaign, Counters)>> {
    Ok(on!(conn, |c| campaigns::table
        .inner_join(cc::table)
        .order(campaigns::id)
        .select((Campaign::as_select(), Counters::as_select()))
        .load(c))?)
}

pub fn counters(conn: &mut Conn, campaign_id: i64) -> Result<Counters> {
    Ok(on!(conn, |c| cc::table
        .find(campaign_id)
        .select(Counters::as_select())
        .first(c))?)
}

/// What a worker checks before each job and between recipients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags {
    pub state: CampaignState,
    pub paused: bool,
    /// See [`Campaign::send_at`].
    pub send_at: Option<i64>,
}

impl Flags {
    /// Whether its start time is still ahead at `now` (ms).
    pub fn before_start(&self, now: i64) -> bool {
        self.send_at.is_some_and(|at| at > now)
    }
}

/// The state, pause flag and start time of the given campaigns (unknown
/// ids are absent).
pub fn flags(conn: &mut Conn, ids: &[i64]) -> Result<Vec<(i64, Flags)>> {
    let rows: Vec<(i64, CampaignState, bool, Option<i64>)> = on!(conn, |c| campaigns::table
        .filter(campaigns::id.eq_any(ids))
        .select((
            campaigns::id,
            campaigns::state,
            campaigns::paused,
            campaigns::send_at,
        ))
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(id, state, paused, send_at)| {
            (
                id,
                Flags {
                    state,
                    paused,
                    send_at,
                },
            )
        })
        .collect())
}

/// Move the campaign's start time to `send_at` (`None`: as soon as it is
/// enqueued) if it still takes edits: a draft, paused, or not started by
/// `start_after` (ms), and not cancelled; checked in the same statement,
/// so a `resume` or the start itself that came first wins. `Ok(None)`: it
/// does not, nothing changed; otherwise the start time it had.
pub fn reschedule(
    conn: &mut Conn,
    id: i64,
    send_at: Option<i64>,
    start_after: i64,
) -> Result<Option<Option<i64>>> {
    conn.transaction(|conn| {
        let Some(before) = get(conn, id)? else {
            return Ok(None);
        };
        let changed = on!(conn, |c| diesel::update(
            campaigns::table
                .find(id)
                .filter(
                    campaigns::paused
                        .eq(true)
                        .or(campaigns::state.eq(CampaignState::Draft))
                        .or(campaigns::send_at.gt(start_after))
                )
                .filter(campaigns::state.ne(CampaignState::Cancelled))
        )
        .set((
            campaigns::send_at.eq(send_at),
            campaigns::updated_at.eq(now_ms()),
        ))
        .execute(c))?;
        Ok((changed == 1).then_some(before.send_at))
    })
}

text_enum! {
    /// The three commands that flip a campaign (the CLI's and the admin
    /// API's action names).
    pub enum Control ("action (pause, resume, cancel)") {
        Pause = "pause",
        Resume = "resume",
        Cancel = "cancel",
    }
}

/// Where a campaign stands, as far as pause, resume and cancel care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub state: CampaignState,
    pub paused: bool,
    /// Every recipient is enqueued and has an outcome ("done" is not
    /// stored: pausing or cancelling it would only relabel history).
    pub done: bool,
}

/// What [`control`] changes once [`decide`] allowed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    SetPaused(bool),
    Cancel,
}

/// The transition table of pause, resume and cancel: the change to make,
/// or why the action makes no sense in this standing (as shown after
/// "cannot ACTION: campaign is …").
pub fn decide(action: Control, s: Standing) -> std::result::Result<Change, &'static str> {
    use CampaignState::{Cancelled, Draft};
    match action {
        Control::Cancel if s.state == Cancelled => Err("already cancelled"),
        _ if s.state == Cancelled => Err("cancelled"),
        Control::Pause if s.state == Draft => {
            Err("a draft (nothing is enqueued: nothing to pause; `cancel` drops it)")
        }
        Control::Pause | Control::Cancel if s.done => Err("done (every recipient has an outcome)"),
        Control::Pause if s.paused => Err("already paused"),
        Control::Pause => Ok(Change::SetPaused(true)),
        Control::Resume if !s.paused => Err("not paused"),
        Control::Resume => Ok(Change::SetPaused(false)),
        Control::Cancel => Ok(Change::Cancel),
    }
}

/// Pause, resume or cancel, refusing transitions that make no sense
/// ([`decide`]).
pub fn control(conn: &mut Conn, name_or_id: &str, action: Control) -> Result<Campaign> {
    conn.transaction(|conn| {
        let campaign = find(conn, name_or_id)?;
        let done = action != Control::Resume
            && campaign.state == CampaignState::Queued
            && counters(conn, campaign.id)?.pending() <= 0;
        let standing = Standing {
            state: campaign.state,
            paused: campaign.paused,
            done,
        };
        let change = decide(action, standing).map_err(|shown| StoreError::IllegalTransition {
            campaign: campaign.name.clone(),
            action: action.as_str(),
            state: shown.to_string(),
        })?;
        apply(conn, campaign.id, change)?;
        find(conn, &campaign.id.to_string())
    })
}

/// Make an allowed [`Change`].
fn apply(conn: &mut Conn, id: i64, change: Change) -> Result<()> {
    let now = now_ms();
    match change {
        Change::SetPaused(paused) => {
            on!(conn, |c| diesel::update(campaigns::table.find(id))
                .set((
                    campaigns::paused.eq(paused),
                    campaigns::pause_reason.eq(None::<String>),
                    campaigns::updated_at.eq(now),
                ))
                .execute(c))?;
            if !paused {
                // The failures that paused it are history: judge what
                // comes after the fix on its own.
                super::autopause::forget(conn, id)?;
                // The rate window restarts at the first outcome after the
                // resume: the pause is never part of a measured rate (the
                // rate before it stands until then).
                on!(conn, |c| diesel::update(cc::table.find(id))
                    .set(cc::window_at.eq(0))
                    .execute(c))?;
            }
        }
        Change::Cancel => {
            on!(conn, |c| diesel::update(campaigns::table.find(id))
                .set((
                    campaigns::state.eq(CampaignState::Cancelled),
                    campaigns::updated_at.eq(now),
                ))
                .execute(c))?;
        }
    }
    Ok(())
}

/// Move a campaign from one state to another if it is still in the first;
/// 1 if it moved.
fn transition(conn: &mut Conn, id: i64, from: CampaignState, to: CampaignState) -> Result<usize> {
    Ok(on!(conn, |c| diesel::update(
        campaigns::table.find(id).filter(campaigns::state.eq(from))
    )
    .set((campaigns::state.eq(to), campaigns::updated_at.eq(now_ms()),))
    .execute(c))?)
}

/// Members of the campaign's list up to its enqueue cursor, and if that is
/// more than its recipient count (members added to the list after enqueue,
/// whom a `requeue` now mails too), raise the count to match so `pending`
/// stays exact. Returns the count now.
pub fn include_members(conn: &mut Conn, campaign: &Campaign) -> Result<i64> {
    use super::schema::list_members as lm;
    let members: i64 = on!(conn, |c| lm::table
        .filter(lm::list_id.eq(campaign.list_id))
        .filter(lm::recipient_id.le(campaign.enqueue_cursor))
        .count()
        .get_result(c))?;
    on!(conn, |c| diesel::update(
        cc::table
            .find(campaign.id)
            .filter(cc::recipients.lt(members))
    )
    .set(cc::recipients.eq(members))
    .execute(c))?;
    Ok(counters(conn, campaign.id)?.recipients)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_table_allows_what_makes_sense_and_says_why_not() {
        use CampaignState::*;
        use Control::*;
        let at = |state, paused, done| Standing {
            state,
            paused,
            done,
        };
        let done = "done (every recipient has an outcome)";
        let cases = [
            (Pause, at(Queued, false, false), Ok(Change::SetPaused(true))),
            (
                Pause,
                at(Enqueuing, false, false),
                Ok(Change::SetPaused(true)),
            ),
            (Pause, at(Queued, true, false), Err("already paused")),
            (Pause, at(Queued, false, true), Err(done)),
            (Pause, at(Cancelled, false, false), Err("cancelled")),
            (
                Resume,
                at(Queued, true, false),
                Ok(Change::SetPaused(false)),
            ),
            // A paused campaign that finished meanwhile can be resumed.
            (Resume, at(Queued, true, true), Ok(Change::SetPaused(false))),
            (Resume, at(Queued, false, false), Err("not paused")),
            (Resume, at(Cancelled, true, false), Err("cancelled")),
            (Cancel, at(Draft, false, false), Ok(Change::Cancel)),
            (Cancel, at(Queued, true, false), Ok(Change::Cancel)),
            (Cancel, at(Queued, false, true), Err(done)),
            (
                Cancel,
                at(Cancelled, false, false),
                Err("already cancelled"),
            ),
        ];
        for (action, standing, want) in cases {
            assert_eq!(decide(action, standing), want, "{action} {standing:?}");
        }
        assert!(decide(Pause, at(Draft, false, false))
            .is_err_and(|why| why.starts_with("a draft") && why.contains("`cancel`")));
    }

    #[test]
    fn control_names_parse_and_print_alike() {
        for c in Control::ALL {
            assert_eq!(c.as_str().parse::<Control>().ok(), Some(*c));
        }
        assert!("stop".parse::<Control>().is_err());
    }
}
