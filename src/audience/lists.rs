//! `mailsplit list create|set|ls|rm|delete`: lists made by hand with a
//! face (a title, offered on `/subscribe` or not, double opt-in or not)
//! and the lists an import builds, managed.
//! Taking members off a list or deleting it never touches the recipients
//! themselves (their status, history and other lists stay); a list is not
//! deleted while one of its campaigns may still send.

use crate::campaign::status::{CampaignStatus, Phase};
pub use crate::store::lists::Face;
use crate::store::lists::{self, ListSummary};
use crate::store::{campaigns, recipients, Conn, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// A campaign of the list may still send (exit 2).
    #[error("list {list:?} is in use: campaign {campaign:?} is {phase}; wait until it is done, or cancel it (`mailsplit cancel {campaign}`)")]
    InUse {
        list: String,
        campaign: String,
        phase: Phase,
    },
    #[error("list {0:?} already exists; `mailsplit list set {0} …` changes its title, public or double opt-in")]
    Exists(String),
    #[error(
        "bad list name {0:?}: use 1 to {MAX_NAME} characters, no spaces or control characters"
    )]
    BadName(String),
    #[error("bad title: {0}")]
    BadTitle(String),
    #[error(
        "nothing to change: give --title, --public/--private or --double-opt-in/--single-opt-in"
    )]
    NothingToSet,
    #[error("list {0:?} is private, and /subscribe takes only public lists: `mailsplit list set {0} --public` first")]
    NotPublic(String),
    #[error("the form posts to MAILSPLIT_PUBLIC_URL/subscribe: set MAILSPLIT_PUBLIC_URL (or --public-url) to where `mailsplit serve`'s public listener is reached")]
    NoPublicUrl,
    #[error("bad --inactive {0:?}: a period, N followed by d, h, m or s, e.g. --inactive 180d")]
    BadPeriod(String),
    #[error("no campaign of list {0:?} tracked opens or clicks, so nobody's activity is known and nothing is pruned; send with `--track opens,clicks` first")]
    NothingTracked(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Longest list name.
pub const MAX_NAME: usize = 100;
/// Longest list title.
pub const MAX_TITLE: usize = 200;

impl ListError {
    /// The user's mistake (exit 2) rather than the environment's.
    pub fn is_usage(&self) -> bool {
        match self {
            ListError::InUse { .. }
            | ListError::Exists(_)
            | ListError::BadName(_)
            | ListError::BadTitle(_)
            | ListError::NothingToSet
            | ListError::NotPublic(_)
            | ListError::NoPublicUrl
            | ListError::BadPeriod(_)
            | ListError::NothingTracked(_) => true,
            ListError::Store(e) => e.is_usage(),
        }
    }
}

fn check_face(face: &Face) -> Result<(), ListError> {
    if let Some(t) = &face.title {
        if t.trim().is_empty() {
            return Err(ListError::BadTitle("it is empty".into()));
        }
        if t.chars().count() > MAX_TITLE || t.chars().any(char::is_control) {
            return Err(ListError::BadTitle(format!(
                "use 1 to {MAX_TITLE} characters on one line"
            )));
        }
    }
    Ok(())
}

/// `list create`: a new, empty list with its face.
pub fn create(conn: &mut Conn, name: &str, face: &Face) -> Result<(), ListError> {
    if name.is_empty()
        || name.chars().count() > MAX_NAME
        || name.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(ListError::BadName(name.to_string()));
    }
    check_face(face)?;
    if !lists::create(conn, name, face)? {
        return Err(ListError::Exists(name.to_string()));
    }
    Ok(())
}

/// `list set`: change a list's title, public or double opt-in.
pub fn set(conn: &mut Conn, name: &str, face: &Face) -> Result<(), ListError> {
    if face == &Face::default() {
        return Err(ListError::NothingToSet);
    }
    check_face(face)?;
    let list_id = recipients::find_list(conn, name)?;
    lists::set(conn, list_id, face)?;
    Ok(())
}

/// `list form`: the public list the embeddable form joins.
pub fn for_form(conn: &mut Conn, name: &str) -> Result<lists::PublicList, ListError> {
    match lists::by_name(conn, name)? {
        Some((list, true)) => Ok(list),
        Some((_, false)) => Err(ListError::NotPublic(name.to_string())),
        // The error that names the lists there are.
        None => Err(recipients::find_list(conn, name)
            .err()
            .map_or_else(|| ListError::NotPublic(name.to_string()), ListError::Store)),
    }
}

/// Every list: name, members, active members.
pub fn overview(conn: &mut Conn) -> Result<Vec<ListSummary>, ListError> {
    Ok(lists::overview(conn)?)
}

/// What `list rm` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    pub removed: u64,
    /// Addresses given that were not on the list (or are no address).
    pub not_members: Vec<String>,
}

/// Take the recipients with these addresses (any spelling of the mailbox)
/// off the list.
pub fn remove(conn: &mut Conn, list: &str, emails: &[String]) -> Result<Removed, ListError> {
    let list_id = recipients::find_list(conn, list)?;
    let mut done = Removed::default();
    conn.transaction(|conn| {
        for email in emails {
            let removed = match crate::mailbox::key(email.trim()) {
                Ok(key) => lists::remove_member(conn, list_id, &key)?,
                Err(_) => false,
            };
            if removed {
                done.removed += 1;
            } else {
                done.not_members.push(email.clone());
            }
        }
        Ok::<_, ListError>(())
    })?;
    Ok(done)
}

/// What `list delete` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    pub members: u64,
    /// Campaigns (done, cancelled or drafts) that still name the list, so
    /// its now empty row stays.
    pub kept_for: Vec<String>,
}

/// Delete a list, refused while one of its campaigns is scheduled,
/// enqueuing, sending or paused.
pub fn delete(conn: &mut Conn, list: &str) -> Result<Deleted, ListError> {
    let list_id = recipients::find_list(conn, list)?;
    conn.transaction(|conn| {
        let mut kept_for = Vec::new();
        for (campaign, counters) in campaigns::list(conn)? {
            if campaign.list_id != list_id {
                continue;
            }
            let phase = CampaignStatus::new(&campaign, &counters).state;
            if matches!(
                phase,
                Phase::Scheduled | Phase::Enqueuing | Phase::Sending | Phase::Paused
            ) {
                return Err(ListError::InUse {
                    list: list.to_string(),
                    campaign: campaign.name,
                    phase,
                });
            }
            kept_for.push(campaign.name);
        }
        let (members, _) = lists::delete(conn, list_id)?;
        Ok(Deleted { members, kept_for })
    })
}

/// Addresses `list prune` shows as its sample.
pub const PRUNE_SAMPLE: i64 = 10;
/// Members taken off per transaction by `list prune`.
const PRUNE_PAGE: i64 = 1_000;

/// What `list prune` found, and did unless a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    /// Members inactive when it began.
    pub inactive: u64,
    /// The first few of them, by recipient id.
    pub sample: Vec<String>,
    /// Members taken off (0 in a dry run).
    pub removed: u64,
}

/// `list prune L --inactive SPAN`: the members the list's tracked
/// campaigns mailed within the last SPAN who opened and clicked nothing
/// (of any campaign) since then. Unless `dry_run`, they are taken off the
/// list as `list rm` does (they stay on file, with their status, history
/// and other lists), a page at a time. `counted` is called with the count
/// and sample before anything is removed.
pub fn prune(
    conn: &mut Conn,
    list: &str,
    inactive: &str,
    dry_run: bool,
    counted: impl FnOnce(&Pruned),
) -> Result<Pruned, ListError> {
    let span =
        crate::clock::parse_span(inactive).ok_or_else(|| ListError::BadPeriod(inactive.into()))?;
    let list_id = recipients::find_list(conn, list)?;
    let mut tracked = Vec::new();
    for id in lists::campaigns_of(conn, list_id)? {
        if crate::store::content::tracked(conn, id)?.any() {
            tracked.push(id);
        }
    }
    if tracked.is_empty() {
        return Err(ListError::NothingTracked(list.to_string()));
    }
    let who = lists::Inactive {
        list_id,
        campaigns: tracked,
        since: crate::store::now_ms() - span,
    };
    let mut done = Pruned {
        inactive: who.count(conn)?,
        sample: who
            .page(conn, 0, PRUNE_SAMPLE)?
            .into_iter()
            .map(|(_, email)| email)
            .collect(),
        removed: 0,
    };
    counted(&done);
    if dry_run {
        return Ok(done);
    }
    let mut after = 0;
    loop {
        let removed = conn.transaction(|conn| {
            let page = who.page(conn, after, PRUNE_PAGE)?;
            let ids: Vec<i64> = page.iter().map(|(id, _)| *id).collect();
            after = ids.last().copied().unwrap_or(i64::MAX);
            Ok::<_, ListError>((lists::remove_members(conn, list_id, &ids)?, ids.len()))
        })?;
        done.removed += removed.0;
        if (removed.1 as i64) < PRUNE_PAGE {
            return Ok(done);
        }
    }
}
