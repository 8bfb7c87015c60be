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
}

/// Store `content` as the campaign's next version; returns its number.
pub fn add(
    conn: &mut Conn,
    campaign_id: i64,
    kind: ContentKind,
    subject: &str,
    html: &str,
    text: &str,
) -> Result<i64> {
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
                cc::kind.eq(kind),
                cc::subject.eq(subject),
                cc::html.eq(html),
                cc::text.eq(text),
                cc::created_at.eq(now_ms()),
            ))
            .execute(c))?;
        Ok(version)
    })
}

/// The campaign's newest content version; `None` for campaigns made
/// before content was stored (they render their built-in template).
pub fn latest(conn: &mut Conn, campaign_id: i64) -> Result<Option<Content>> {
    Ok(on!(conn, |c| cc::table
        .filter(cc::campaign_id.eq(campaign_id))
        .order(cc::version.desc())
        .select(Content::as_select())
        .first(c)
        .optional())?)
}

/// Forget every version (the campaign is being deleted).
pub fn delete(conn: &mut Conn, campaign_id: i64) -> Result<usize> {
    Ok(on!(conn, |c| diesel::delete(
        cc::table.filter(cc::campaign_id.eq(campaign_id))
    )
    .execute(c))?)
}
