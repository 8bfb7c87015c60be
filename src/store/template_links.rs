//! Clicks on links a content version's template writes (`href="{{ p.url
//! }}"`), counted by URL (table `campaign_template_links`). Every URL here
//! came with a genuine `/l/` token made for it, so the table holds only
//! what the campaign's own renders produced; [`top`] lists a bounded part
//! of it.

use diesel::prelude::*;

use super::schema::campaign_template_links as t;
use super::{on, Conn, Result};

/// One more click on `url` of `campaign`, inside the hit writer's
/// transaction.
pub fn count_click(conn: &mut Conn, campaign: i64, url: &str) -> Result<()> {
    on!(conn, |x| diesel::insert_into(t::table)
        .values((t::campaign_id.eq(campaign), t::url.eq(url)))
        .on_conflict_do_nothing()
        .execute(x))?;
    on!(conn, |x| diesel::update(t::table.find((campaign, url)))
        .set(t::clicks.eq(t::clicks + 1))
        .execute(x))?;
    Ok(())
}

/// The `limit` most clicked template-written URLs of `campaign` (most
/// clicks first, then by URL), and how many distinct URLs were clicked.
pub fn top(conn: &mut Conn, campaign: i64, limit: i64) -> Result<(Vec<(String, i64)>, i64)> {
    let rows = on!(conn, |x| t::table
        .filter(t::campaign_id.eq(campaign))
        .order((t::clicks.desc(), t::url))
        .limit(limit)
        .select((t::url, t::clicks))
        .load(x))?;
    let distinct = on!(conn, |x| t::table
        .filter(t::campaign_id.eq(campaign))
        .count()
        .get_result(x))?;
    Ok((rows, distinct))
}
