//! What view in browser (`/v/TOKEN`) reads: whether a campaign's message
//! went to a recipient, with which content version, and that version.

use diesel::prelude::*;

use super::content::Content;
use super::deliveries::DeliveryState;
use super::schema::{campaign_content as cc, deliveries as d};
use super::{on, Conn, Result};

/// The content version campaign `campaign` sent recipient `recipient`
/// (`Some(None)`: sent before content was stored); `None` when nothing
/// was sent to them.
pub fn sent_version(conn: &mut Conn, campaign: i64, recipient: i64) -> Result<Option<Option<i64>>> {
    Ok(on!(conn, |c| d::table
        .find((campaign, recipient))
        .filter(d::state.eq(DeliveryState::Sent))
        .select(d::content_version)
        .first(c)
        .optional())?)
}

/// Content version `version` of campaign `campaign`.
pub fn version(conn: &mut Conn, campaign: i64, version: i64) -> Result<Option<Content>> {
    Ok(on!(conn, |c| cc::table
        .filter(cc::campaign_id.eq(campaign))
        .filter(cc::version.eq(version))
        .select(Content::as_select())
        .first(c)
        .optional())?)
}
