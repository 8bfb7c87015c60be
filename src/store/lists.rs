//! Lists as `mailsplit list` manages them: an overview, a list created
//! with its face (title, public, double opt-in) or changed, members taken
//! off, a list deleted. Recipients themselves, their history and their
//! other lists are never touched here.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};

use super::recipients::RecipientStatus;
use super::schema::{campaigns, list_members as m, lists as l, recipients as r};
use super::{on, Conn, Result};

/// One line of `list ls`.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct ListSummary {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = BigInt)]
    pub members: i64,
    /// Members who may be mailed.
    #[diesel(sql_type = BigInt)]
    pub active: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub title: Option<String>,
    #[diesel(sql_type = Bool)]
    pub is_public: bool,
    #[diesel(sql_type = Bool)]
    pub double_opt_in: bool,
}

/// How a list shows itself to subscribers. `None` fields of a change
/// leave the stored value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Face {
    pub title: Option<String>,
    pub is_public: Option<bool>,
    pub double_opt_in: Option<bool>,
}

/// A list the subscribers' pages may show.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct PublicList {
    pub id: i64,
    pub name: String,
    pub title: Option<String>,
    pub double_opt_in: bool,
}

impl PublicList {
    /// The title, or the name when the list has none.
    pub fn label(&self) -> &str {
        self.title.as_deref().unwrap_or(&self.name)
    }
}

/// Create list `name` with its face; false when a list of that name
/// already exists (nothing changed).
pub fn create(conn: &mut Conn, name: &str, face: &Face) -> Result<bool> {
    let made = on!(conn, |c| diesel::insert_into(l::table)
        .values((
            l::name.eq(name),
            l::created_at.eq(super::now_ms()),
            l::title.eq(face.title.as_deref()),
            l::is_public.eq(face.is_public.unwrap_or(false)),
            l::double_opt_in.eq(face.double_opt_in.unwrap_or(false)),
        ))
        .on_conflict(l::name)
        .do_nothing()
        .execute(c))?;
    Ok(made == 1)
}

/// Change what `face` names of list `list_id`.
pub fn set(conn: &mut Conn, list_id: i64, face: &Face) -> Result<()> {
    conn.transaction(|conn| {
        if let Some(title) = &face.title {
            on!(conn, |c| diesel::update(l::table.find(list_id))
                .set(l::title.eq(title))
                .execute(c))?;
        }
        if let Some(p) = face.is_public {
            on!(conn, |c| diesel::update(l::table.find(list_id))
                .set(l::is_public.eq(p))
                .execute(c))?;
        }
        if let Some(d) = face.double_opt_in {
            on!(conn, |c| diesel::update(l::table.find(list_id))
                .set(l::double_opt_in.eq(d))
                .execute(c))?;
        }
        Ok(())
    })
}

/// Every public list, by name.
pub fn public(conn: &mut Conn) -> Result<Vec<PublicList>> {
    Ok(on!(conn, |c| l::table
        .filter(l::is_public.eq(true))
        .order(l::name)
        .select((l::id, l::name, l::title, l::double_opt_in))
        .load(c))?)
}

/// List `name` with its face, public or not.
pub fn by_name(conn: &mut Conn, name: &str) -> Result<Option<(PublicList, bool)>> {
    let row: Option<(i64, String, Option<String>, bool, bool)> = on!(conn, |c| l::table
        .filter(l::name.eq(name))
        .select((l::id, l::name, l::title, l::double_opt_in, l::is_public))
        .first(c)
        .optional())?;
    Ok(row.map(|(id, name, title, double_opt_in, is_public)| {
        (
            PublicList {
                id,
                name,
                title,
                double_opt_in,
            },
            is_public,
        )
    }))
}

/// Every list with its member counts, by name.
pub fn overview(conn: &mut Conn) -> Result<Vec<ListSummary>> {
    let sql = format!(
        "SELECT l.name AS name, \
         (SELECT COUNT(*) FROM list_members m WHERE m.list_id = l.id) AS members, \
         (SELECT COUNT(*) FROM list_members m JOIN recipients r ON r.id = m.recipient_id \
          WHERE m.list_id = l.id AND r.status = '{}') AS active, \
         l.title AS title, l.is_public AS is_public, l.double_opt_in AS double_opt_in \
         FROM lists l ORDER BY l.name",
        RecipientStatus::Active.as_str()
    );
    Ok(on!(conn, |c| diesel::sql_query(&sql).load(c))?)
}

/// Take the recipient with mailbox `key` off the list; false when it was
/// not a member.
pub fn remove_member(conn: &mut Conn, list_id: i64, key: &str) -> Result<bool> {
    let removed = on!(conn, |c| diesel::delete(
        m::table
            .filter(m::list_id.eq(list_id))
            .filter(m::recipient_id.eq_any(r::table.filter(r::email_key.eq(key)).select(r::id)))
    )
    .execute(c))?;
    Ok(removed > 0)
}

/// Remove every member of the list, and the list itself unless a
/// campaign still names it (its history needs the row). Returns the
/// members removed and whether the list row went too.
pub fn delete(conn: &mut Conn, list_id: i64) -> Result<(u64, bool)> {
    conn.transaction(|conn| {
        let removed = on!(conn, |c| diesel::delete(
            m::table.filter(m::list_id.eq(list_id))
        )
        .execute(c))?;
        let named: i64 = on!(conn, |c| campaigns::table
            .filter(campaigns::list_id.eq(list_id))
            .count()
            .get_result(c))?;
        let gone =
            named == 0 && on!(conn, |c| diesel::delete(l::table.find(list_id)).execute(c))? == 1;
        Ok((removed as u64, gone))
    })
}

/// Which members `list prune` takes: mailed by one of `campaigns` (the
/// list's campaigns that tracked opens or clicks) since `since` (ms),
/// with no open or click of any campaign since then.
#[derive(Debug, Clone)]
pub struct Inactive {
    pub list_id: i64,
    pub campaigns: Vec<i64>,
    pub since: i64,
}

impl Inactive {
    /// The members' condition, on `list_members m`. Only numbers from
    /// the database go into the text. A sent delivery's `updated_at` is
    /// when it was sent; the deliveries are found by their key
    /// (campaign, recipient), the engagement by `engagement_by_recipient`.
    fn condition(&self) -> String {
        let ids: Vec<String> = self.campaigns.iter().map(i64::to_string).collect();
        let (list, since) = (self.list_id, self.since);
        format!(
            "m.list_id = {list} \
             AND EXISTS (SELECT 1 FROM deliveries d WHERE d.campaign_id IN ({ids}) \
               AND d.recipient_id = m.recipient_id AND d.state = '{sent}' \
               AND d.updated_at >= {since}) \
             AND NOT EXISTS (SELECT 1 FROM engagement e \
               WHERE e.recipient_id = m.recipient_id \
               AND (e.first_open_at >= {since} OR e.first_click_at >= {since}))",
            ids = ids.join(","),
            sent = super::DeliveryState::Sent.as_str(),
        )
    }

    /// How many members it takes.
    pub fn count(&self, conn: &mut Conn) -> Result<u64> {
        if self.campaigns.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "SELECT COUNT(*) AS n FROM list_members m WHERE {}",
            self.condition()
        );
        let row: Count = on!(conn, |c| diesel::sql_query(&sql).get_result(c))?;
        Ok(row.n as u64)
    }

    /// Up to `limit` of them after recipient id `after`, by id: (id, email).
    pub fn page(&self, conn: &mut Conn, after: i64, limit: i64) -> Result<Vec<(i64, String)>> {
        if self.campaigns.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT r.id AS id, r.email AS email FROM list_members m \
             JOIN recipients r ON r.id = m.recipient_id \
             WHERE {} AND m.recipient_id > {after} ORDER BY m.recipient_id LIMIT {limit}",
            self.condition()
        );
        let rows: Vec<Member> = on!(conn, |c| diesel::sql_query(&sql).load(c))?;
        Ok(rows.into_iter().map(|m| (m.id, m.email)).collect())
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Member {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    email: String,
}

/// Take these recipients off the list; how many were members.
pub fn remove_members(conn: &mut Conn, list_id: i64, ids: &[i64]) -> Result<u64> {
    let removed = on!(conn, |c| diesel::delete(
        m::table
            .filter(m::list_id.eq(list_id))
            .filter(m::recipient_id.eq_any(ids))
    )
    .execute(c))?;
    Ok(removed as u64)
}

/// The list's campaigns, by id.
pub fn campaigns_of(conn: &mut Conn, list_id: i64) -> Result<Vec<i64>> {
    Ok(on!(conn, |c| campaigns::table
        .filter(campaigns::list_id.eq(list_id))
        .order(campaigns::id)
        .select(campaigns::id)
        .load(c))?)
}
