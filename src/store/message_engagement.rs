//! What recipients did with tracked message-template mail (flow steps):
//! one row per message in `message_engagement`, first open (a person's;
//! a machine's apart, by the rule campaigns follow), first click, counts.
//! Unique opens and clicks of a set of messages are the rows with a first
//! time; one person opening one message twice counts once. A first open
//! by a person or a first click also writes the webhook event, in the
//! same transaction.

use diesel::prelude::*;

use super::engagement::MACHINE_OPEN_WINDOW_MS;
use super::outbox::EventKind;
use super::schema::message_engagement as e;
use super::schema::messages as m;
use super::{messages, on, Conn, Result};

/// One open or click of a message's link, with a genuine token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageHit {
    /// `proxy`: it came from a known mail proxy (Apple's prefetch).
    Open { proxy: bool },
    /// The URL the message's link token was made for.
    Click(String),
}

/// Record `hit` of message `message` at `at` (ms); false when there is no
/// such message (erased since).
pub fn record(conn: &mut Conn, message: i64, hit: &MessageHit, at: i64) -> Result<bool> {
    conn.transaction(|conn| {
        let sent_at: Option<Option<i64>> = on!(conn, |x| m::table
            .find(message)
            .select(m::sent_at)
            .first(x)
            .optional())?;
        let Some(sent_at) = sent_at else {
            return Ok(false);
        };
        on!(conn, |x| diesel::insert_into(e::table)
            .values(e::message_id.eq(message))
            .on_conflict_do_nothing()
            .execute(x))?;
        let row = e::table.find(message);
        let (first, event) = match hit {
            MessageHit::Open { proxy } => {
                let machine = *proxy || sent_at.is_some_and(|s| s >= at - MACHINE_OPEN_WINDOW_MS);
                let first = if machine {
                    on!(conn, |x| diesel::update(row)
                        .set(e::machine_opens.eq(e::machine_opens + 1))
                        .execute(x))?;
                    on!(conn, |x| diesel::update(
                        row.filter(e::first_machine_open_at.is_null())
                    )
                    .set(e::first_machine_open_at.eq(at))
                    .execute(x))?
                } else {
                    on!(conn, |x| diesel::update(row)
                        .set(e::opens.eq(e::opens + 1))
                        .execute(x))?;
                    on!(conn, |x| diesel::update(
                        row.filter(e::first_open_at.is_null())
                    )
                    .set(e::first_open_at.eq(at))
                    .execute(x))?
                };
                // Machine opens make no event, as a campaign's.
                (first, (!machine).then_some((EventKind::Opened, None)))
            }
            MessageHit::Click(url) => {
                on!(conn, |x| diesel::update(row)
                    .set(e::clicks.eq(e::clicks + 1))
                    .execute(x))?;
                let first = on!(conn, |x| diesel::update(
                    row.filter(e::first_click_at.is_null())
                )
                .set(e::first_click_at.eq(at))
                .execute(x))?;
                (first, Some((EventKind::Clicked, Some(url.as_str()))))
            }
        };
        if let (1, Some((kind, url))) = (first, event) {
            messages::event_with_link(conn, kind, message, at, url)?;
        }
        Ok(true)
    })
}
