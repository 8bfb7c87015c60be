//! Lists, recipients and list membership: what `import` writes and what
//! `enqueue` and the worker read.

use diesel::prelude::*;

use super::schema::{list_members, lists, recipients};
use super::{now_ms, on, Conn, InnerMut, Result, StoreError};
use crate::store::prepared::{ids_json, Bind, Prepared};

text_enum! {
    /// Whether a recipient may be mailed.
    pub enum RecipientStatus ("recipient status (active, unsubscribed, bounced)") {
        Active = "active",
        Unsubscribed = "unsubscribed",
        Bounced = "bounced",
    }
}

impl RecipientStatus {
    /// A status as a user writes it in a CSV column: any case, surrounding
    /// blanks, and an empty cell meaning active.
    pub fn from_input(raw: &str) -> Result<RecipientStatus> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "" => Ok(RecipientStatus::Active),
            other => other.parse(),
        }
    }
}

/// What a worker needs to render one message.
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = recipients)]
pub struct Recipient {
    pub id: i64,
    pub email: String,
    pub name: String,
    pub attributes: String,
    pub status: RecipientStatus,
}

/// Find a list by name, creating it if needed.
pub fn get_or_create_list(conn: &mut Conn, name: &str) -> Result<i64> {
    let now = now_ms();
    on!(conn, |c| diesel::insert_into(lists::table)
        .values((lists::name.eq(name), lists::created_at.eq(now)))
        .on_conflict(lists::name)
        .do_nothing()
        .execute(c))?;
    find_list(conn, name)
}

/// The id of an existing list, or an error naming the lists that exist.
pub fn find_list(conn: &mut Conn, name: &str) -> Result<i64> {
    let found: Option<i64> = on!(conn, |c| lists::table
        .filter(lists::name.eq(name))
        .select(lists::id)
        .first(c)
        .optional())?;
    match found {
        Some(id) => Ok(id),
        None => {
            let names: Vec<String> = on!(conn, |c| lists::table
                .select(lists::name)
                .order(lists::name)
                .load(c))?;
            Err(StoreError::UnknownList {
                name: name.to_string(),
                choices: if names.is_empty() {
                    "none yet (create one with `mailsplit import FILE.csv --list NAME`)".into()
                } else {
                    names.join(", ")
                },
            })
        }
    }
}

/// A list's name by id.
pub fn list_name(conn: &mut Conn, list_id: i64) -> Result<String> {
    Ok(on!(conn, |c| lists::table
        .find(list_id)
        .select(lists::name)
        .first(c))?)
}

/// Number of recipients on a list.
pub fn list_size(conn: &mut Conn, list_id: i64) -> Result<i64> {
    Ok(on!(conn, |c| list_members::table
        .filter(list_members::list_id.eq(list_id))
        .count()
        .get_result(c))?)
}

/// Counts from one import batch.
/// One keyset page of a list: `(recipient id, status)` for members with an id
/// above `after`, in id order. Constant memory however large the list is.
pub fn member_page(
    conn: &mut Conn,
    list_id: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, RecipientStatus)>> {
    Ok(on!(conn, |c| list_members::table
        .inner_join(recipients::table)
        .filter(list_members::list_id.eq(list_id))
        .filter(list_members::recipient_id.gt(after))
        // The same bound on the other side of the join, so a merge join
        // starts at `after` instead of at the first recipient.
        .filter(recipients::id.gt(after))
        .order(list_members::recipient_id)
        .select((list_members::recipient_id, recipients::status))
        .limit(limit)
        .load(c))?)
}

/// A recipient's id by email address, in any spelling of its mailbox
/// (`Ada@Example.com` finds `ada@example.com`).
pub fn find_by_email(conn: &mut Conn, email: &str) -> Result<Option<i64>> {
    let Ok(key) = crate::mailbox::key(email) else {
        return Ok(None);
    };
    Ok(on!(conn, |c| recipients::table
        .filter(recipients::email_key.eq(&key))
        .select(recipients::id)
        .first(c)
        .optional())?)
}

/// Rows per page of [`backfill_keys`].
const BACKFILL_PAGE: i64 = 1_000;

/// Give every recipient without a key its key (migration 4 keyed the ASCII
/// addresses in SQL; IDNA needs this code). A recipient whose mailbox
/// already has a row (the one keyed first) is a twin from an older import:
/// it stops being mailed (unsubscribed, with the reason, unless it already
/// was not active), the row holding the mailbox joins its lists and
/// inherits a non-active status, and the twin keeps no key. Idempotent;
/// returns the twins newly taken out of mailing.
pub fn backfill_keys(conn: &mut Conn) -> Result<u64> {
    let mut twins = 0;
    let mut after = 0i64;
    loop {
        let page: Vec<(i64, String, RecipientStatus, Option<String>)> =
            on!(conn, |c| recipients::table
                .filter(recipients::email_key.is_null())
                .filter(recipients::id.gt(after))
                .order(recipients::id)
                .select((
                    recipients::id,
                    recipients::email,
                    recipients::status,
                    recipients::status_reason
                ))
                .limit(BACKFILL_PAGE)
                .load(c))?;
        let Some(&(last, ..)) = page.last() else {
            return Ok(twins);
        };
        after = last;
        conn.transaction(|conn| {
            for (id, email, status, reason) in page {
                // An address that no longer parses keeps no key; it could
                // not be mailed anyway.
                let Ok(key) = crate::mailbox::key(&email) else {
                    continue;
                };
                let holder: Option<(i64, RecipientStatus)> = on!(conn, |c| recipients::table
                    .filter(recipients::email_key.eq(&key))
                    .select((recipients::id, recipients::status))
                    .first(c)
                    .optional())?;
                match holder {
                    None => {
                        on!(conn, |c| diesel::update(recipients::table.find(id))
                            .set(recipients::email_key.eq(&key))
                            .execute(c))?;
                    }
                    Some((keeper, keeper_status)) => {
                        // Counted once: a merged twin is no longer active.
                        twins += u64::from(status == RecipientStatus::Active);
                        merge_twin(conn, id, status, reason, keeper, keeper_status)?;
                    }
                }
            }
            Ok::<_, StoreError>(())
        })?;
    }
}

/// See [`backfill_keys`]: `twin` is another spelling of `keeper`'s mailbox.
fn merge_twin(
    conn: &mut Conn,
    twin: i64,
    twin_status: RecipientStatus,
    twin_reason: Option<String>,
    keeper: i64,
    keeper_status: RecipientStatus,
) -> Result<()> {
    let now = now_ms();
    if twin_status != RecipientStatus::Active && keeper_status == RecipientStatus::Active {
        let reason = format!(
            "{} (as recipient {twin})",
            twin_reason.as_deref().unwrap_or(twin_status.as_str())
        );
        on!(conn, |c| diesel::update(recipients::table.find(keeper))
            .set((
                recipients::status.eq(twin_status),
                recipients::status_reason.eq(reason.as_str()),
                recipients::status_at.eq(now),
            ))
            .execute(c))?;
    }
    if twin_status == RecipientStatus::Active {
        let reason = format!("same mailbox as recipient {keeper}");
        on!(conn, |c| diesel::update(recipients::table.find(twin))
            .set((
                recipients::status.eq(RecipientStatus::Unsubscribed),
                recipients::status_reason.eq(reason.as_str()),
                recipients::status_at.eq(now),
            ))
            .execute(c))?;
    }
    let lists: Vec<i64> = on!(conn, |c| list_members::table
        .filter(list_members::recipient_id.eq(twin))
        .select(list_members::list_id)
        .load(c))?;
    for list_id in lists {
        on!(conn, |c| diesel::insert_into(list_members::table)
            .values((
                list_members::list_id.eq(list_id),
                list_members::recipient_id.eq(keeper),
            ))
            .on_conflict_do_nothing()
            .execute(c))?;
    }
    Ok(())
}

/// Load recipients by id (any order).
pub fn load(conn: &mut Conn, ids: &[i64]) -> Result<Vec<Recipient>> {
    Ok(match conn.inner_mut() {
        // One fixed text, prepared once per connection (`eq_any` would be
        // one `?` per id, parsed anew for every job a worker claims).
        InnerMut::Sqlite(c) => {
            let ids = ids_json(ids);
            Prepared::new(
                "SELECT id, email, name, attributes, status FROM recipients \
                 WHERE id IN (SELECT value FROM json_each(?))",
                vec![Bind::Json(&ids)],
            )
            .load(c)?
        }
        InnerMut::Pg(c) => recipients::table
            .filter(recipients::id.eq_any(ids))
            .select(Recipient::as_select())
            .load(c)?,
    })
}
