//! Every row held about one person, found by the mailbox's identity key:
//! the recipient, list memberships, the deliveries ledger, engagement,
//! bounces, webhook events still in the outbox, transactional messages,
//! and suppression entries. What `subscriber show` and `subscriber
//! export` print (GDPR art. 15); read-only.

use std::collections::{BTreeMap, HashSet};

use diesel::prelude::*;
use serde_json::{json, Value};

use super::schema::{
    bounces as b, campaigns as cp, deliveries as d, engagement as e, list_members as lm,
    lists as l, message_engagement as me, messages as m, recipients as r, webhook_outbox as o,
};
use super::{on, suppressions, Conn, Result};

type RecipientRow = (i64, String, String, String, String, Option<i64>);
type DeliveryRow = (i64, String, i32, Option<String>, i64, Option<i64>);
type EngagementRow = (i64, Option<i64>, i64, Option<i64>, i64, Option<i64>);
type BounceRow = (
    Option<i64>,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
);
type EventRow = (i64, String, Option<i64>, i64);

/// The rows keyed by one recipient id.
struct Held {
    lists: Vec<String>,
    deliveries: Vec<DeliveryRow>,
    engagement: Vec<EngagementRow>,
    bounces: Vec<BounceRow>,
    events: Vec<EventRow>,
}

/// Everything about the address whose key is `key`, as one JSON object;
/// `None` when nothing at all is held.
pub fn export(conn: &mut Conn, key: &str) -> Result<Option<Value>> {
    let recipient: Option<RecipientRow> = on!(conn, |c| r::table
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
    let messages = messages_to(conn, key)?;
    let suppressed = suppressions::matching(conn, &[key.to_string()])?.remove(key);
    let Some(recipient) = recipient else {
        if messages.is_empty() && suppressed.is_none() {
            return Ok(None);
        }
        return Ok(Some(json!({
            "email": key,
            "recipient": null,
            "lists": [],
            "deliveries": [],
            "engagement": [],
            "bounces": [],
            "webhook_events": [],
            "messages": messages,
            "suppressed": suppressed,
        })));
    };
    let held = held_by(conn, recipient.0)?;
    let names = campaign_names(conn, &held)?;
    let mut out = document(recipient, &held, &names);
    out["messages"] = Value::Array(messages);
    out["suppressed"] = json!(suppressed);
    Ok(Some(out))
}

fn held_by(conn: &mut Conn, id: i64) -> Result<Held> {
    let lists = on!(conn, |c| lm::table
        .inner_join(l::table)
        .filter(lm::recipient_id.eq(id))
        .order(l::name)
        .select(l::name)
        .load(c))?;
    let deliveries = on!(conn, |c| d::table
        .filter(d::recipient_id.eq(id))
        .order(d::campaign_id)
        .select((
            d::campaign_id,
            d::state,
            d::attempts,
            d::last_error,
            d::updated_at,
            d::content_version
        ))
        .load(c))?;
    let engagement = on!(conn, |c| e::table
        .filter(e::recipient_id.eq(id))
        .order(e::campaign_id)
        .select((
            e::campaign_id,
            e::first_open_at,
            e::opens,
            e::first_click_at,
            e::clicks,
            e::unsubscribed_at
        ))
        .load(c))?;
    let bounces = on!(conn, |c| b::table
        .filter(b::recipient_id.eq(id))
        .order(b::id)
        .select((
            b::campaign_id,
            b::email,
            b::kind,
            b::status,
            b::reason,
            b::source,
            b::received_at
        ))
        .load(c))?;
    let events = on!(conn, |c| o::table
        .filter(o::recipient_id.eq(id))
        .order(o::id)
        .select((o::id, o::kind, o::campaign_id, o::at))
        .load(c))?;
    Ok(Held {
        lists,
        deliveries,
        engagement,
        bounces,
        events,
    })
}

/// The names of the campaigns the rows name.
fn campaign_names(conn: &mut Conn, held: &Held) -> Result<BTreeMap<i64, String>> {
    let mut ids: HashSet<i64> = held.deliveries.iter().map(|x| x.0).collect();
    ids.extend(held.engagement.iter().map(|x| x.0));
    ids.extend(held.bounces.iter().filter_map(|x| x.0));
    ids.extend(held.events.iter().filter_map(|x| x.2));
    let ids: Vec<i64> = ids.into_iter().collect();
    Ok(on!(conn, |c| cp::table
        .filter(cp::id.eq_any(&ids))
        .select((cp::id, cp::name))
        .load::<(i64, String)>(c))?
    .into_iter()
    .collect())
}

/// The export's object, less its messages and suppression entry.
fn document(recipient: RecipientRow, held: &Held, names: &BTreeMap<i64, String>) -> Value {
    let (id, email, name, attributes, status, created_at) = recipient;
    let campaign = |id: Option<i64>| id.and_then(|i| names.get(&i).cloned());
    let attributes: Value = serde_json::from_str(&attributes).unwrap_or(Value::Null);
    json!({
        "email": email,
        "recipient": {
            "id": id,
            "email": email,
            "name": name,
            "attributes": attributes,
            "status": status,
            "created_at": created_at.map(|ms| crate::clock::rfc3339(ms, crate::clock::Precision::AsNeeded)),
        },
        "lists": held.lists,
        "deliveries": held.deliveries.iter().map(|(cid, state, attempts, err, at, version)| json!({
            "campaign": campaign(Some(*cid)), "state": state, "attempts": attempts,
            "last_error": err, "updated_at": at, "content_version": version,
        })).collect::<Vec<_>>(),
        "engagement": held.engagement.iter().map(|(cid, open, opens, click, clicks, unsub)| json!({
            "campaign": campaign(Some(*cid)), "first_open_at": open, "opens": opens,
            "first_click_at": click, "clicks": clicks, "unsubscribed_at": unsub,
        })).collect::<Vec<_>>(),
        "bounces": held.bounces.iter().map(|(cid, email, kind, status, reason, source, at)| json!({
            "campaign": campaign(*cid), "email": email, "kind": kind, "status": status,
            "reason": reason, "source": source, "received_at": at,
        })).collect::<Vec<_>>(),
        "webhook_events": held.events.iter().map(|(oid, kind, cid, at)| json!({
            "id": oid, "kind": kind, "campaign": campaign(*cid), "at": at,
        })).collect::<Vec<_>>(),
    })
}

/// Transactional messages to the address: `to_addr` is free text (`Name
/// <addr>`), so candidates are found by a case-folded substring and kept
/// only when their address's key is `key`. A full scan of `messages`: an
/// export is rare, and a person's rows must not be missed.
pub fn messages_to(conn: &mut Conn, key: &str) -> Result<Vec<Value>> {
    let local = key.rsplit_once('@').map_or(key, |(l, _)| l);
    let pattern = format!("%{}%", local.replace(['%', '_'], ""));
    type MessageRow = (
        (i64, String, String, String, String),
        (Option<String>, i64, Option<i64>),
        Option<(i64, i64)>,
    );
    let rows: Vec<MessageRow> = on!(conn, |c| m::table
        .left_join(me::table.on(me::message_id.eq(m::id)))
        .filter(
            diesel::dsl::sql::<diesel::sql_types::Bool>("lower(to_addr) LIKE ")
                .bind::<diesel::sql_types::Text, _>(pattern.to_lowercase())
        )
        .order(m::id)
        .select((
            (m::id, m::template_name, m::to_addr, m::data, m::status),
            (m::reply, m::created_at, m::sent_at),
            (me::opens, me::clicks).nullable(),
        ))
        .load(c))?;
    Ok(rows
        .into_iter()
        .filter(|row| address_key(&row.0 .2).as_deref() == Some(key))
        .map(
            |((id, template, to, data, status), (reply, created, sent), engaged)| {
                let (opens, clicks) = engaged.unwrap_or_default();
                json!({
                    "id": id, "template": template, "to": to,
                    "data": serde_json::from_str::<Value>(&data).unwrap_or(Value::Null),
                    "status": status, "reply": reply, "created_at": created, "sent_at": sent,
                    "opens": opens, "clicks": clicks,
                })
            },
        )
        .collect())
}

/// The key of the address in `Name <addr>` or `addr`.
pub(super) fn address_key(to: &str) -> Option<String> {
    let addr = match (to.rfind('<'), to.rfind('>')) {
        (Some(a), Some(b)) if a < b => &to[a + 1..b],
        _ => to,
    };
    crate::mailbox::key(addr.trim()).ok()
}
