//! Campaign content written at run time: the subject, HTML and text
//! templates of each version of a campaign's content (table
//! `campaign_content`). Workers read the newest version.

use diesel::prelude::*;

use super::schema::campaign_content as cc;
use super::{now_ms, on, Conn, Result};

text_enum! {
    /// Where a content version came from.
    pub enum ContentKind ("content kind") {
        /// `--html FILE [--text FILE]`.
        Html = "html",
        /// `--markdown FILE`: both parts made from it.
        Markdown = "markdown",
        /// `--template NAME`: a built-in starter compiled into the binary;
        /// only the subject is stored.
        Builtin = "template",
    }
}

/// What a content version tracks (`campaign create --track opens,clicks`);
/// stored as `opens,clicks`, `opens`, `clicks` or empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Track {
    pub opens: bool,
    pub clicks: bool,
}

impl Track {
    pub fn any(self) -> bool {
        self.opens || self.clicks
    }

    /// The stored spelling; anything else in the column reads as nothing
    /// tracked.
    pub fn from_column(s: &str) -> Track {
        Track {
            opens: s.split(',').any(|p| p == "opens"),
            clicks: s.split(',').any(|p| p == "clicks"),
        }
    }
}

impl std::fmt::Display for Track {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<&str> = [(self.opens, "opens"), (self.clicks, "clicks")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| *name)
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// A version's tracking as stored with it: what, and its link table
/// (link 1 first; empty unless clicks are tracked).
#[derive(Debug, Clone, Default)]
pub struct VersionTracking {
    pub track: Track,
    pub links: Vec<String>,
}

/// One stored content version.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = cc)]
pub struct Content {
    pub campaign_id: i64,
    pub version: i64,
    pub kind: ContentKind,
    /// Jinja templates (already converted: Markdown to HTML, CSS inlined,
    /// text derived from the HTML when none was given).
    pub subject: String,
    pub html: String,
    pub text: String,
    pub created_at: i64,
    /// What it tracks, as stored (see [`Track::from_column`]).
    pub track: String,
}

/// Store `content` as the campaign's next version; returns its number.
pub fn add(
    conn: &mut Conn,
    campaign_id: i64,
    kind: ContentKind,
    subject: &str,
    html: &str,
    text: &str,
    tracking: &VersionTracking,
) -> Result<i64> {
    let parts = Parts {
        kind,
        subject,
        html,
        text,
        tracking,
    };
    insert(conn, campaign_id, 0, &parts)
}

/// One content version's parts, to store.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    pub kind: ContentKind,
    pub subject: &'a str,
    pub html: &'a str,
    pub text: &'a str,
    pub tracking: &'a VersionTracking,
}

/// Store A/B variant `variant`'s own content as a version of the
/// campaign's (its links numbered in a table of their own) that the
/// campaign itself never sends; returns its number.
pub fn add_variant(conn: &mut Conn, campaign_id: i64, variant: i64, parts: &Parts) -> Result<i64> {
    insert(conn, campaign_id, variant, parts)
}

fn insert(conn: &mut Conn, campaign_id: i64, variant: i64, p: &Parts) -> Result<i64> {
    conn.transaction(|conn| {
        let last: Option<i64> = on!(conn, |c| cc::table
            .filter(cc::campaign_id.eq(campaign_id))
            .select(diesel::dsl::max(cc::version))
            .first(c))?;
        let version = last.unwrap_or(0) + 1;
        on!(conn, |c| diesel::insert_into(cc::table)
            .values((
                cc::campaign_id.eq(campaign_id),
                cc::version.eq(version),
                cc::kind.eq(p.kind),
                cc::subject.eq(p.subject),
                cc::html.eq(p.html),
                cc::text.eq(p.text),
                cc::created_at.eq(now_ms()),
                cc::track.eq(p.tracking.track.to_string()),
                cc::variant.eq(variant),
            ))
            .execute(c))?;
        add_links(conn, campaign_id, version, &p.tracking.links)?;
        Ok(version)
    })
}

/// The campaign's newest content version (its own, not an A/B
/// variant's); `None` for campaigns made before content was stored (they
/// render their built-in template).
pub fn latest(conn: &mut Conn, campaign_id: i64) -> Result<Option<Content>> {
    Ok(on!(conn, |c| cc::table
        .filter(cc::campaign_id.eq(campaign_id))
        .filter(cc::variant.eq(0))
        .order(cc::version.desc())
        .select(Content::as_select())
        .first(c)
        .optional())?)
}

/// One content version as the dashboard lists it (without its parts).
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = cc)]
pub struct VersionInfo {
    pub version: i64,
    pub kind: ContentKind,
    /// The subject template.
    pub subject: String,
    pub created_at: i64,
}

/// Every content version of the campaign, newest first.
pub fn history(conn: &mut Conn, campaign_id: i64) -> Result<Vec<VersionInfo>> {
    Ok(on!(conn, |c| cc::table
        .filter(cc::campaign_id.eq(campaign_id))
        .filter(cc::variant.eq(0))
        .order(cc::version.desc())
        .select(VersionInfo::as_select())
        .load(c))?)
}

fn add_links(conn: &mut Conn, campaign_id: i64, version: i64, urls: &[String]) -> Result<()> {
    use super::schema::campaign_links as l;
    for chunk in urls.chunks(500).enumerate() {
        let (page, urls) = chunk;
        let rows: Vec<_> = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                (
                    l::campaign_id.eq(campaign_id),
                    l::version.eq(version),
                    l::n.eq((page * 500 + i + 1) as i64),
                    l::url.eq(url.as_str()),
                )
            })
            .collect();
        on!(conn, |c| diesel::insert_into(l::table)
            .values(&rows)
            .execute(c))?;
    }
    Ok(())
}

/// A version's link table, link 1 first.
pub fn links(conn: &mut Conn, campaign_id: i64, version: i64) -> Result<Vec<String>> {
    use super::schema::campaign_links as l;
    Ok(on!(conn, |c| l::table
        .filter(l::campaign_id.eq(campaign_id))
        .filter(l::version.eq(version))
        .order(l::n)
        .select(l::url)
        .load(c))?)
}

/// What any of the campaign's content versions tracks (an edit may have
/// turned tracking off after tracked mail went out): one row per version.
pub fn tracked(conn: &mut Conn, campaign_id: i64) -> Result<Track> {
    let rows: Vec<String> = on!(conn, |c| cc::table
        .filter(cc::campaign_id.eq(campaign_id))
        .select(cc::track)
        .load(c))?;
    Ok(rows.iter().fold(Track::default(), |t, s| {
        let v = Track::from_column(s);
        Track {
            opens: t.opens || v.opens,
            clicks: t.clicks || v.clicks,
        }
    }))
}

/// Forget every version (the campaign is being deleted).
pub fn delete(conn: &mut Conn, campaign_id: i64) -> Result<usize> {
    use super::schema::campaign_links as l;
    on!(conn, |c| diesel::delete(
        l::table.filter(l::campaign_id.eq(campaign_id))
    )
    .execute(c))?;
    Ok(on!(conn, |c| diesel::delete(
        cc::table.filter(cc::campaign_id.eq(campaign_id))
    )
    .execute(c))?)
}

/// The newest content version of each of `ids` that has one.
pub fn latest_versions(conn: &mut Conn, ids: &[i64]) -> Result<Vec<(i64, i64)>> {
    let rows: Vec<(i64, Option<i64>)> = on!(conn, |c| cc::table
        .filter(cc::campaign_id.eq_any(ids))
        .filter(cc::variant.eq(0))
        .group_by(cc::campaign_id)
        .select((cc::campaign_id, diesel::dsl::max(cc::version)))
        .load(c))?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, v)| v.map(|v| (id, v)))
        .collect())
}

/// How many recipients were sent each content version, by version (the
/// ledger's `content_version` of its `sent` rows; rows sent before it was
/// recorded are not counted).
pub fn sent_by_version(conn: &mut Conn, campaign_id: i64) -> Result<Vec<(i64, i64)>> {
    use super::schema::deliveries as d;
    use super::DeliveryState;
    let rows: Vec<(Option<i64>, i64)> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::state.eq(DeliveryState::Sent))
        .filter(d::content_version.is_not_null())
        .group_by(d::content_version)
        .select((d::content_version, diesel::dsl::count_star()))
        .load(c))?;
    Ok(rows
        .into_iter()
        .filter_map(|(v, n)| v.map(|v| (v, n)))
        .collect())
}

/// What `campaign edit` changes besides the content.
pub struct EditedCampaign<'a> {
    pub subject: &'a str,
    pub from_addr: &'a str,
    /// What `campaign list` calls the content (see `campaigns.template`).
    pub template: &'a str,
}

/// Store an edit: the campaign's subject, sender and content label, and
/// the content as its next version, in one transaction, if the campaign
/// still takes edits: a draft, paused, or not started by `start_after`
/// (ms), and not cancelled (checked in the same statement, so a `resume`,
/// `enqueue` or the start that came first wins). `Ok(None)`: it does not,
/// nothing changed; otherwise the new version.
pub fn edit(
    conn: &mut Conn,
    campaign_id: i64,
    fields: &EditedCampaign,
    kind: ContentKind,
    parts: (&str, &str),
    start_after: i64,
    tracking: &VersionTracking,
) -> Result<Option<i64>> {
    use super::schema::campaigns as c;
    use super::CampaignState;
    conn.transaction(|conn| {
        let editable = c::paused
            .eq(true)
            .or(c::state.eq(CampaignState::Draft))
            .or(c::send_at.gt(start_after))
            .and(c::state.ne(CampaignState::Cancelled));
        let changed = on!(conn, |x| diesel::update(
            c::table.filter(c::id.eq(campaign_id)).filter(editable)
        )
        .set((
            c::subject.eq(fields.subject),
            c::from_addr.eq(fields.from_addr),
            c::template.eq(fields.template),
            c::updated_at.eq(now_ms()),
        ))
        .execute(x))?;
        if changed == 0 {
            return Ok(None);
        }
        add(
            conn,
            campaign_id,
            kind,
            fields.subject,
            parts.0,
            parts.1,
            tracking,
        )
        .map(Some)
    })
}

/// Each sent recipient's address with the content version it got, by
/// address (what the ledger says; for checks and audits).
pub fn sent_versions(conn: &mut Conn, campaign_id: i64) -> Result<Vec<(String, Option<i64>)>> {
    use super::schema::{deliveries as d, recipients as r};
    use super::DeliveryState;
    Ok(on!(conn, |c| d::table
        .inner_join(r::table.on(r::id.eq(d::recipient_id)))
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::state.eq(DeliveryState::Sent))
        .order(r::email)
        .select((r::email, d::content_version))
        .load(c))?)
}
