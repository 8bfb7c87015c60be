//! One subscriber at a time, for `/api/v1/subscribers`. Writes that add a
//! person go through the import's own batch writer ([`imports`]), so its
//! rules hold here as they do for a file: nobody unsubscribed or bounced
//! becomes active again, a missing field changes nothing, attributes merge
//! key by key.

use diesel::prelude::*;
use serde_json::{Map, Value};

use super::imports::{self, Row};
use super::recipients::RecipientStatus;
use super::schema::{list_members as m, lists as l, recipients as r};
use super::{now_ms, on, Conn, Result};

/// A subscriber as the API shows one.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscriber {
    pub id: i64,
    pub email: String,
    pub name: String,
    /// A JSON object, as stored.
    pub attributes: String,
    pub status: RecipientStatus,
    /// `None`: created by an import (or before the API existed).
    pub created_at: Option<i64>,
    /// Names of the lists the subscriber is a member of, sorted.
    pub lists: Vec<String>,
}

type Found = (i64, String, String, String, RecipientStatus, Option<i64>);

/// The subscriber whose mailbox is `key` ([`crate::mailbox::key`]).
pub fn find(conn: &mut Conn, key: &str) -> Result<Option<Subscriber>> {
    let row: Option<Found> = on!(conn, |c| r::table
        .filter(r::email_key.eq(key))
        .select((
            r::id,
            r::email,
            r::name,
            r::attributes,
            r::status,
            r::created_at
        ))
        .first(c)
        .optional())?;
    let Some((id, email, name, attributes, status, created_at)) = row else {
        return Ok(None);
    };
    let lists: Vec<String> = on!(conn, |c| m::table
        .inner_join(l::table)
        .filter(m::recipient_id.eq(id))
        .select(l::name)
        .order(l::name.asc())
        .load(c))?;
    Ok(Some(Subscriber {
        id,
        email,
        name,
        attributes,
        status,
        created_at,
        lists,
    }))
}

/// What [`upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upserted {
    New,
    Known,
    /// The address was erased at its owner's request
    /// ([`super::forgotten`]): nothing written, no list made.
    Forgotten,
}

/// Write `row` into each of `lists` as an import of that one row would
/// (never re-subscribing, never adding a forgotten address).
pub fn upsert(conn: &mut Conn, row: &Row, lists: &[String]) -> Result<Upserted> {
    conn.transaction(|conn| {
        if super::forgotten::is_forgotten(conn, &row.email_key)? {
            return Ok(Upserted::Forgotten);
        }
        let existed = find_id(conn, &row.email_key)?.is_some();
        for list in lists {
            let run = imports::begin(conn, list)?;
            imports::write_batch(conn, run, std::slice::from_ref(row), false)?;
        }
        if existed {
            return Ok(Upserted::Known);
        }
        let now = now_ms();
        on!(conn, |c| diesel::update(
            r::table.filter(r::email_key.eq(&row.email_key))
        )
        .set(r::created_at.eq(now))
        .execute(c))?;
        Ok(Upserted::New)
    })
}

fn find_id(conn: &mut Conn, key: &str) -> Result<Option<i64>> {
    Ok(on!(conn, |c| r::table
        .filter(r::email_key.eq(key))
        .select(r::id)
        .first(c)
        .optional())?)
}

/// Change a subscriber's name and attributes (a `null` attribute removes
/// its key), as an import row would; true when anything changed.
pub fn patch(
    conn: &mut Conn,
    id: i64,
    name: Option<&str>,
    changes: &Map<String, Value>,
) -> Result<bool> {
    conn.transaction(|conn| {
        let (old_name, old_attrs): (String, String) = on!(conn, |c| r::table
            .find(id)
            .select((r::name, r::attributes))
            .first(c))?;
        let before: Map<String, Value> = serde_json::from_str(&old_attrs).unwrap_or_default();
        let after = imports::merged(before.clone(), changes);
        let new_name = name.unwrap_or(&old_name);
        if new_name == old_name && after == before {
            return Ok(false);
        }
        let attributes = Value::Object(after).to_string();
        on!(conn, |c| diesel::update(r::table.find(id))
            .set((
                r::name.eq(new_name),
                r::attributes.eq(&attributes),
                r::updated_at.eq(now_ms()),
            ))
            .execute(c))?;
        Ok(true)
    })
}
