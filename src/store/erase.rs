//! Erasure of one person (GDPR art. 17; `subscriber forget`), in one
//! transaction. Rows that only say *that* something happened stay, so
//! every counter and `report` stays exact; what says *who* goes:
//!
//! - the recipient row stays as a tombstone, `forgotten-ID@DOMAIN` (the
//!   domain kept so `report`'s per-domain figures stay), no key, no name,
//!   no attributes, never mailed again (an active one becomes
//!   `unsubscribed`, reason `forgotten`);
//! - memberships, engagement rows (the campaigns' counters keep the
//!   totals), sign-ups, pending webhook events and the suppression entry
//!   are deleted;
//! - the ledger's rows (deliveries, bounces, transactional messages, flow
//!   entries) stay, with every spelling of the address and the name taken
//!   out of their texts ([`scrub`]), a message's `data` and a flow entry's
//!   row emptied;
//! - the address's keyed hash goes into `forgotten`
//!   ([`super::forgotten`]).

use diesel::prelude::*;

use super::flows::{flow_entries as fe, EntryState};
use super::messages::MessageStatus;
use super::recipients::RecipientStatus;
use super::schema::{
    bounces as b, campaign_template_links as tl, deliveries as d, engagement as e,
    list_members as lm, messages as m, recipients as r, signups as s, suppressions as sp,
    webhook_outbox as o,
};
use super::{forgotten, now_ms, on, Conn, Result};

pub mod scrub;
use scrub::Needles;

/// The reason a tombstone's status gives.
pub const REASON: &str = "forgotten";

/// What one erasure touched.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Erased {
    /// Recipient rows made tombstones (twins of old imports included).
    pub recipients: u64,
    pub memberships: u64,
    pub engagement: u64,
    /// Ledger rows kept, whose texts were scrubbed.
    pub deliveries: u64,
    pub bounces: u64,
    pub messages: u64,
    pub flow_entries: u64,
    /// Deleted.
    pub signups: u64,
    pub webhook_events: u64,
    /// The address had its own suppression entry (deleted; a confirmed
    /// sign-up puts it back).
    pub suppressed: bool,
    /// Other texts that quoted the person (reports, replies, URLs).
    pub texts: u64,
}

/// A recipient row of the person.
struct Person {
    id: i64,
    email: String,
    status: RecipientStatus,
    reason: Option<String>,
}

/// Erase everything held about mailbox `key` ([`crate::mailbox::key`]).
pub fn forget(conn: &mut Conn, key: &str) -> Result<Erased> {
    conn.transaction(|conn| {
        let (people, mut needles) = people_of(conn, key)?;
        let messages = messages_to(conn, key, &mut needles)?;
        let mut done = Erased::default();
        for p in &people {
            erase_recipient(conn, p, &needles, &mut done)?;
        }
        erase_messages(conn, &messages, &needles, &mut done)?;
        done.signups = on!(conn, |c| diesel::delete(
            s::table.filter(s::email_key.eq(key))
        )
        .execute(c))? as u64;
        done.suppressed = on!(conn, |c| diesel::delete(sp::table.find(key)).execute(c))? > 0;
        done.texts += scrub::small_tables(conn, &needles)?;
        done.texts += template_links(conn, &needles)?;
        forgotten::remember(conn, key, done.suppressed)?;
        Ok(done)
    })
}

/// The person's recipient rows (with twins an old import left without a
/// key), and the spellings to erase.
fn people_of(conn: &mut Conn, key: &str) -> Result<(Vec<Person>, Needles)> {
    type Row = (i64, String, String, RecipientStatus, Option<String>);
    let rows: Vec<Row> = on!(conn, |c| r::table
        .filter(r::email_key.eq(key))
        .select((r::id, r::email, r::name, r::status, r::status_reason))
        .load(c))?;
    // An ASCII key is the address lower-cased: a keyless twin spelled
    // with capitals is found by folding its case.
    let twins: Vec<Row> = if key.is_ascii() {
        on!(conn, |c| r::table
            .filter(
                diesel::dsl::sql::<diesel::sql_types::Bool>(
                    "email_key IS NULL AND lower(email) = "
                )
                .bind::<diesel::sql_types::Text, _>(key)
            )
            .select((r::id, r::email, r::name, r::status, r::status_reason))
            .load(c))?
    } else {
        Vec::new()
    };
    let mut needles = Needles::default();
    needles.add_address(key);
    let mut people = Vec::new();
    for (id, email, name, status, reason) in rows.into_iter().chain(twins) {
        if people.iter().any(|p: &Person| p.id == id) {
            continue;
        }
        needles.add_address(&email);
        needles.add_name(&name);
        people.push(Person {
            id,
            email,
            status,
            reason,
        });
    }
    Ok((people, needles))
}

/// `forgotten-ID@DOMAIN`: unique, and in the same domain group.
fn tombstone(id: i64, email: &str) -> String {
    let domain = email.rsplit_once('@').map_or("invalid", |(_, d)| d);
    format!("{REASON}-{id}@{domain}")
}

fn erase_recipient(conn: &mut Conn, p: &Person, n: &Needles, done: &mut Erased) -> Result<()> {
    let id = p.id;
    let (status, reason) = match p.status {
        RecipientStatus::Active => (RecipientStatus::Unsubscribed, Some(REASON.to_string())),
        other => (
            other,
            p.reason.as_deref().map(|t| n.scrub(t).unwrap_or(t.into())),
        ),
    };
    let now = now_ms();
    on!(conn, |c| diesel::update(r::table.find(id))
        .set((
            r::email.eq(tombstone(id, &p.email)),
            r::email_key.eq(None::<String>),
            r::name.eq(""),
            r::attributes.eq("{}"),
            r::status.eq(status),
            r::status_reason.eq(reason),
            r::status_at.eq(Some(now)),
            r::updated_at.eq(now),
        ))
        .execute(c))?;
    done.recipients += 1;
    done.memberships += on!(conn, |c| diesel::delete(
        lm::table.filter(lm::recipient_id.eq(id))
    )
    .execute(c))? as u64;
    done.engagement += on!(conn, |c| diesel::delete(
        e::table.filter(e::recipient_id.eq(id))
    )
    .execute(c))? as u64;
    done.webhook_events += on!(conn, |c| diesel::delete(
        o::table.filter(o::recipient_id.eq(Some(id)))
    )
    .execute(c))? as u64;
    erase_ledger(conn, id, &tombstone(id, &p.email), n, done)?;
    done.flow_entries += erase_flow_entries(conn, id, now)?;
    Ok(())
}

/// Flow entries of recipient `id`: their row emptied, a key replaced, an
/// active one left (`forgotten`). How many.
fn erase_flow_entries(conn: &mut Conn, id: i64, now: i64) -> Result<u64> {
    let entries = on!(conn, |c| diesel::update(
        fe::table.filter(fe::recipient_id.eq(id))
    )
    .set((fe::row_data.eq("{}"), fe::updated_at.eq(now)))
    .execute(c))?;
    on!(conn, |c| diesel::update(
        fe::table
            .filter(fe::recipient_id.eq(id))
            .filter(fe::entry_key.ne(""))
    )
    .set(
        fe::entry_key.eq(diesel::dsl::sql::<diesel::sql_types::Text>(
            "'forgotten:' || CAST(id AS TEXT)"
        ))
    )
    .execute(c))?;
    on!(conn, |c| diesel::update(
        fe::table
            .filter(fe::recipient_id.eq(id))
            .filter(fe::state.eq(EntryState::Active))
    )
    .set((
        fe::state.eq(EntryState::Left),
        fe::left_reason.eq(Some(REASON)),
        fe::due_at.eq(None::<i64>),
    ))
    .execute(c))?;
    Ok(entries as u64)
}

/// Deliveries and bounces of recipient `id`: kept, their texts scrubbed.
fn erase_ledger(
    conn: &mut Conn,
    id: i64,
    tomb: &str,
    n: &Needles,
    done: &mut Erased,
) -> Result<()> {
    let rows: Vec<(i64, Option<String>)> = on!(conn, |c| d::table
        .filter(d::recipient_id.eq(id))
        .select((d::campaign_id, d::last_error))
        .load(c))?;
    done.deliveries += rows.len() as u64;
    for (campaign, text) in rows {
        if let Some(clean) = text.as_deref().and_then(|t| n.scrub(t)) {
            on!(conn, |c| diesel::update(d::table.find((campaign, id)))
                .set(d::last_error.eq(Some(clean)))
                .execute(c))?;
        }
    }
    let rows: Vec<(i64, String, Option<String>)> = on!(conn, |c| b::table
        .filter(b::recipient_id.eq(id))
        .select((b::id, b::reason, b::status))
        .load(c))?;
    done.bounces += rows.len() as u64;
    for (bid, reason, status) in rows {
        let reason = n.scrub(&reason).unwrap_or(reason);
        let status = status.map(|t| n.scrub(&t).unwrap_or(t));
        on!(conn, |c| diesel::update(b::table.find(bid))
            .set((
                b::email.eq(tomb),
                b::reason.eq(reason),
                b::status.eq(status)
            ))
            .execute(c))?;
    }
    Ok(())
}

/// Transactional messages to the address: `to_addr` is free text (`Name
/// <addr>`), so candidates are found by a case-folded substring of the
/// local part and kept only when their address's key is `key`. Their
/// display names join the needles.
fn messages_to(conn: &mut Conn, key: &str, n: &mut Needles) -> Result<Vec<(i64, String)>> {
    let local = key.rsplit_once('@').map_or(key, |(l, _)| l);
    let pattern = format!("%{}%", local.replace(['%', '_', '\\'], "_"));
    let rows: Vec<(i64, String)> = on!(conn, |c| m::table
        .filter(
            diesel::dsl::sql::<diesel::sql_types::Bool>("lower(to_addr) LIKE ")
                .bind::<diesel::sql_types::Text, _>(pattern.to_lowercase())
        )
        .select((m::id, m::to_addr))
        .load(c))?;
    let mine: Vec<(i64, String)> = rows
        .into_iter()
        .filter(|(_, to)| super::person::address_key(to).as_deref() == Some(key))
        .collect();
    for (_, to) in &mine {
        if let Some((name, _)) = to.rsplit_once('<') {
            n.add_name(name.trim().trim_matches('"'));
        }
        n.add_address(
            to.rsplit_once('<')
                .map_or(to.as_str(), |(_, a)| a)
                .trim_end_matches('>'),
        );
    }
    Ok(mine)
}

/// The messages: kept (their status counts), addressed to a tombstone,
/// `data` emptied, the reply scrubbed; an idempotency key that quotes the
/// person is dropped; one still waiting is never sent.
fn erase_messages(
    conn: &mut Conn,
    mine: &[(i64, String)],
    n: &Needles,
    done: &mut Erased,
) -> Result<()> {
    for (id, to) in mine {
        let (reply, key): (Option<String>, Option<String>) = on!(conn, |c| m::table
            .find(id)
            .select((m::reply, m::idempotency_key))
            .first(c))?;
        let reply = reply.map(|t| n.scrub(&t).unwrap_or(t));
        // A key that quotes the person goes; the others stay (`flow
        // report` counts a flow's messages by their keys).
        let key = key.filter(|k| n.scrub(k).is_none());
        let domain = to
            .rsplit_once('@')
            .map_or("invalid", |(_, d)| d.trim_end_matches('>'));
        on!(conn, |c| diesel::update(m::table.find(id))
            .set((
                m::to_addr.eq(format!("{REASON}@{domain}")),
                m::data.eq("{}"),
                m::body_hash.eq(""),
                m::reply.eq(reply),
                m::idempotency_key.eq(key),
            ))
            .execute(c))?;
        on!(conn, |c| diesel::update(m::table.find(id).filter(
            m::status.eq_any([MessageStatus::Queued, MessageStatus::Claimed])
        ))
        .set((
            m::status.eq(MessageStatus::Suppressed),
            m::reply.eq(Some(REASON)),
        ))
        .execute(c))?;
        done.webhook_events += on!(conn, |c| diesel::delete(
            o::table.filter(o::message_id.eq(Some(*id)))
        )
        .execute(c))? as u64;
        done.messages += 1;
    }
    Ok(())
}

/// Clicks counted by a URL a template wrote: a URL that carries the
/// address is renamed (its clicks added to a row of the same new name).
fn template_links(conn: &mut Conn, n: &Needles) -> Result<u64> {
    let mut changed = 0;
    for pattern in n.patterns() {
        let rows: Vec<(i64, String, i64)> = on!(conn, |c| tl::table
            .filter(
                diesel::dsl::sql::<diesel::sql_types::Bool>("lower(url) LIKE ")
                    .bind::<diesel::sql_types::Text, _>(&pattern)
            )
            .select((tl::campaign_id, tl::url, tl::clicks))
            .load(c))?;
        for (campaign, url, clicks) in rows {
            let Some(clean) = n.scrub(&url) else { continue };
            on!(conn, |c| diesel::delete(tl::table.find((campaign, &url)))
                .execute(c))?;
            on!(conn, |c| diesel::insert_into(tl::table)
                .values((
                    tl::campaign_id.eq(campaign),
                    tl::url.eq(&clean),
                    tl::clicks.eq(clicks),
                ))
                .on_conflict((tl::campaign_id, tl::url))
                .do_update()
                .set(tl::clicks.eq(tl::clicks + clicks))
                .execute(c))?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Where the erased text may still be after [`forget`] committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Afterwards {
    /// SQLite: the write-ahead log was copied into the database file
    /// (whose freed space `secure_delete` zeroed) and truncated to zero.
    Clean,
    /// SQLite: another connection was reading, so the log still holds
    /// older pages until the next checkpoint.
    LogBusy,
    /// PostgreSQL: old row versions stay in the table files until VACUUM
    /// reuses their space, and in the WAL until it is recycled.
    DeadTuples,
}

#[derive(QueryableByName)]
struct Checkpoint {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    busy: i32,
}

/// After [`forget`]: on SQLite, checkpoint the write-ahead log and
/// truncate it (it holds the pages as they were before).
pub fn flush(conn: &mut Conn) -> Result<Afterwards> {
    match conn.inner_mut() {
        super::InnerMut::Sqlite(c) => {
            let rows: Vec<Checkpoint> =
                diesel::sql_query("PRAGMA wal_checkpoint(TRUNCATE)").load(c)?;
            Ok(match rows.first() {
                Some(r) if r.busy == 0 => Afterwards::Clean,
                _ => Afterwards::LogBusy,
            })
        }
        super::InnerMut::Pg(_) => Ok(Afterwards::DeadTuples),
    }
}
