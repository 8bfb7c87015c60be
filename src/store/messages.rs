//! The transactional messages ledger. A message is inserted once per
//! idempotency key (the unique index decides, whatever the number of
//! concurrent retries), then claimed, sent and recorded by a worker with
//! the campaign ledger's discipline: a claim is a token with a lease, and
//! only the holder of the token may record. A message is marked `sending`
//! just before it goes on the wire: a claim that lapses there (the worker
//! died between handing the message to the relay and recording the reply)
//! is failed rather than sent again, because the relay may have taken it.

use diesel::prelude::*;

use super::outbox::{self, EventKind};
use super::prepared::{Bind, Prepared};
use super::schema::{bounces as b, messages as m, recipients as r, webhook_outbox as o};
use super::{on, Conn, RecipientStatus, Result};

text_enum! {
    /// A message's state. `claimed` and `sending` are a worker's; the API
    /// shows both as `queued`.
    pub enum MessageStatus ("message status") {
        Queued = "queued",
        Claimed = "claimed",
        Sending = "sending",
        Sent = "sent",
        Failed = "failed",
        Bounced = "bounced",
        Suppressed = "suppressed",
    }
}

impl MessageStatus {
    /// The status as the API and the CLI show it.
    pub fn public(self) -> MessageStatus {
        match self {
            MessageStatus::Claimed | MessageStatus::Sending => MessageStatus::Queued,
            s => s,
        }
    }

    /// Whether the message has its outcome.
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            MessageStatus::Queued | MessageStatus::Claimed | MessageStatus::Sending
        )
    }
}

/// One message as stored.
#[derive(Debug, Clone, Queryable, QueryableByName, Selectable)]
#[diesel(table_name = m)]
pub struct Message {
    pub id: i64,
    pub template_id: i64,
    pub template_name: String,
    pub to_addr: String,
    pub data: String,
    pub idempotency_key: Option<String>,
    pub body_hash: String,
    pub status: MessageStatus,
    pub attempts: i64,
    pub claim_token: Option<i64>,
    pub claimed_until: i64,
    pub reply: Option<String>,
    pub created_at: i64,
    pub sent_at: Option<i64>,
}

/// What `submit` stores.
pub struct NewMessage<'a> {
    pub template_id: i64,
    pub template_name: &'a str,
    pub to_addr: &'a str,
    pub data: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub body_hash: &'a str,
    pub status: MessageStatus,
    pub reply: Option<&'a str>,
    pub now: i64,
}

/// What an insert under a key found.
#[derive(Debug)]
pub enum Inserted {
    /// A new message.
    New(Message),
    /// The same key and body came before: that message.
    Again(Message),
    /// The key was used for another body.
    Conflict,
}

/// Insert a message, or find the one its idempotency key already names.
pub fn insert(conn: &mut Conn, n: &NewMessage) -> Result<Inserted> {
    // Prepared once per connection (see `super::prepared`): diesel
    // prepared this INSERT anew each time, which was a fifth of the flows'
    // scheduler's time (it stores every due step with it).
    const INSERT: &str = "INSERT INTO messages (template_id, template_name, to_addr, data, \
         idempotency_key, body_hash, status, reply, created_at, next_attempt_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING \
         RETURNING id, template_id, template_name, to_addr, data, idempotency_key, body_hash, \
         status, attempts, claim_token, claimed_until, reply, created_at, sent_at";
    let inserted: Option<Message> = on!(conn, |c| Prepared::new(
        INSERT,
        vec![
            Bind::Int(n.template_id),
            Bind::Text(n.template_name),
            Bind::Text(n.to_addr),
            Bind::Text(n.data),
            Bind::OptText(n.idempotency_key),
            Bind::Text(n.body_hash),
            Bind::Text(n.status.as_str()),
            Bind::OptText(n.reply),
            Bind::Int(n.now),
            Bind::Int(n.now),
        ],
    )
    .load::<Message>(c))?
    .pop();
    if let Some(new) = inserted {
        return Ok(Inserted::New(new));
    }
    let Some(key) = n.idempotency_key else {
        return Err(diesel::NotFound.into());
    };
    let before: Message = on!(conn, |c| m::table
        .filter(m::idempotency_key.eq(key))
        .select(Message::as_select())
        .first(c))?;
    Ok(if before.body_hash == n.body_hash {
        Inserted::Again(before)
    } else {
        Inserted::Conflict
    })
}

/// Whether a message was stored under idempotency key `key`.
pub fn key_used(conn: &mut Conn, key: &str) -> Result<bool> {
    let id: Option<i64> = on!(conn, |c| m::table
        .filter(m::idempotency_key.eq(key))
        .select(m::id)
        .first(c)
        .optional())?;
    Ok(id.is_some())
}

pub fn find(conn: &mut Conn, id: i64) -> Result<Option<Message>> {
    Ok(on!(conn, |c| m::table
        .find(id)
        .select(Message::as_select())
        .first(c)
        .optional())?)
}

/// What the ledger knows of an address a message goes to: its recipient
/// row, and whether it ever complained.
#[derive(Debug)]
pub struct Addressee {
    pub id: i64,
    pub status: RecipientStatus,
    /// JSON text.
    pub attributes: String,
    pub complained: bool,
}

impl Addressee {
    /// Why this address gets no message of a stream: bounced or
    /// complained (any stream), unsubscribed (marketing only). `None`: it
    /// may be mailed.
    pub fn suppressed(&self, marketing: bool) -> Option<&'static str> {
        match self.status {
            _ if self.complained => Some("the address complained about earlier mail"),
            RecipientStatus::Bounced => Some("the address bounced"),
            RecipientStatus::Unsubscribed if marketing => Some("the address unsubscribed"),
            _ => None,
        }
    }
}

/// The addressees on file among mailbox keys `keys`, by key: two
/// statements for a batch, whatever its size (one per key and kind was
/// most of a message's reads).
pub fn addressees(
    conn: &mut Conn,
    keys: &[String],
) -> Result<std::collections::HashMap<String, Addressee>> {
    let rows = addressee_rows(conn, keys)?;
    if rows.is_empty() {
        return Ok(Default::default());
    }
    let ids: Vec<i64> = rows.iter().map(|row| row.0).collect();
    let complained = complained_among(conn, &ids)?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, key, status, attributes)| {
            let a = Addressee {
                id,
                status,
                attributes,
                complained: complained.contains(&id),
            };
            Some((key?, a))
        })
        .collect())
}

/// A recipient row of [`addressees`]: id, mailbox key, status, attributes.
type AddresseeRow = (i64, Option<String>, RecipientStatus, String);

/// The recipient rows whose mailbox key is among `keys`. On SQLite one
/// fixed text, prepared once per connection (diesel's `eq_any` is one
/// `?` per key, parsed anew for every batch), the keys as one JSON array.
fn addressee_rows(conn: &mut Conn, keys: &[String]) -> Result<Vec<AddresseeRow>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        email_key: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: RecipientStatus,
        #[diesel(sql_type = diesel::sql_types::Text)]
        attributes: String,
    }
    Ok(match conn.inner_mut() {
        super::InnerMut::Sqlite(c) => {
            let json = super::prepared::texts_json(keys);
            let rows: Vec<Row> = Prepared::new(
                "SELECT id, email_key, status, attributes FROM recipients \
                 WHERE email_key IN (SELECT value FROM json_each(?))",
                vec![Bind::Json(&json)],
            )
            .load(c)?;
            rows.into_iter()
                .map(|r| (r.id, r.email_key, r.status, r.attributes))
                .collect()
        }
        super::InnerMut::Pg(c) => r::table
            .filter(r::email_key.eq_any(keys))
            .select((r::id, r::email_key, r::status, r::attributes))
            .load(c)?,
    })
}

/// Which of recipients `ids` ever complained (see [`addressee_rows`] for
/// SQLite's fixed text).
pub fn complained_among(conn: &mut Conn, ids: &[i64]) -> Result<std::collections::HashSet<i64>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        recipient_id: i64,
    }
    let complaint = super::bounces::BounceKind::Complaint;
    Ok(match conn.inner_mut() {
        super::InnerMut::Sqlite(c) => {
            let json = super::prepared::ids_json(ids);
            let rows: Vec<Row> = Prepared::new(
                "SELECT DISTINCT recipient_id FROM bounces \
                 WHERE recipient_id IN (SELECT value FROM json_each(?)) AND kind = ?",
                vec![Bind::Json(&json), Bind::Text(complaint.as_str())],
            )
            .load(c)?;
            rows.into_iter().map(|r| r.recipient_id).collect()
        }
        super::InnerMut::Pg(c) => b::table
            .filter(b::recipient_id.eq_any(ids))
            .filter(b::kind.eq(complaint))
            .select(b::recipient_id)
            .distinct()
            .load::<i64>(c)?
            .into_iter()
            .collect(),
    })
}

/// What a claim found.
#[derive(Debug)]
pub enum Claim {
    /// This worker holds it now.
    Mine(Box<Message>),
    /// It has its outcome (or just got one: a lapsed `sending`).
    Done,
    /// Another worker's claim runs until then (ms).
    Busy(i64),
    /// No such message.
    Unknown,
}

/// Why message `id` (not claimed just now) is not this worker's: it has
/// its outcome, is unknown, or another worker's claim runs. A `sending`
/// claim that lapsed is failed here: the worker stopped between handing
/// the message to the relay and recording its reply, and the relay may
/// have taken it, so it is never sent again.
fn not_claimed(conn: &mut Conn, id: i64, now: i64) -> Result<Claim> {
    let Some(msg) = find(conn, id)? else {
        return Ok(Claim::Unknown);
    };
    if msg.status.is_final() {
        return Ok(Claim::Done);
    }
    if msg.status == MessageStatus::Sending && msg.claimed_until < now {
        let why = "the worker stopped after handing the message to the relay and before recording its reply; not sent again, so it is never sent twice";
        let lapsed = m::status
            .eq(MessageStatus::Sending)
            .and(m::claimed_until.lt(now));
        let n = on!(conn, |c| diesel::update(m::table.find(id).filter(lapsed))
            .set((m::status.eq(MessageStatus::Failed), m::reply.eq(why)))
            .execute(c))?;
        if n == 1 {
            event(conn, EventKind::Failed, id, now)?;
        }
        return Ok(Claim::Done);
    }
    Ok(Claim::Busy(msg.claimed_until))
}

/// The outcome of one message, in SQL that never changes: prepared once
/// per connection (see [`super::prepared`]; diesel prepares every UPDATE
/// anew). Only the claim's holder records, while the message is `claimed`
/// or `sending`.
const RECORD: &str = "UPDATE messages SET status = ?, reply = ?, sent_at = ? \
     WHERE id = ? AND claim_token = ? AND status IN (?, ?)";

pub mod batch;
mod insert;
pub use insert::{insert_many, Filed};

/// One outcome of [`batch::record`], inside its transaction.
fn record_in(
    conn: &mut Conn,
    (id, token): (i64, i64),
    status: MessageStatus,
    reply: Option<&str>,
    now: i64,
) -> Result<bool> {
    let sent_at = (status == MessageStatus::Sent).then_some(now);
    let n = on!(conn, |c| Prepared::new(
        RECORD,
        vec![
            Bind::Text(status.as_str()),
            Bind::OptText(reply),
            Bind::OptInt(sent_at),
            Bind::Int(id),
            Bind::Int(token),
            Bind::Text(MessageStatus::Claimed.as_str()),
            Bind::Text(MessageStatus::Sending.as_str()),
        ],
    )
    .execute(c))?;
    let kind = match status {
        MessageStatus::Sent => Some(EventKind::Sent),
        MessageStatus::Failed => Some(EventKind::Failed),
        _ => None,
    };
    if let (1, Some(kind)) = (n, kind) {
        event(conn, kind, id, now)?;
    }
    Ok(n == 1)
}

/// A later bounce of a sent message (its VERP token named it).
pub fn bounced(conn: &mut Conn, id: i64, reason: &str, now: i64) -> Result<bool> {
    conn.transaction(|conn| {
        let n = on!(conn, |c| diesel::update(
            m::table.find(id).filter(m::status.eq(MessageStatus::Sent))
        )
        .set((m::status.eq(MessageStatus::Bounced), m::reply.eq(reason)))
        .execute(c))?;
        if n == 1 {
            event(conn, EventKind::Bounced, id, now)?;
        }
        Ok(n == 1)
    })
}

/// One webhook event about message `id`, for every webhook that wants it.
fn event(conn: &mut Conn, kind: EventKind, id: i64, at: i64) -> Result<()> {
    event_with_link(conn, kind, id, at, None)
}

/// [`event`], with the URL of a clicked link.
pub(super) fn event_with_link(
    conn: &mut Conn,
    kind: EventKind,
    id: i64,
    at: i64,
    url: Option<&str>,
) -> Result<()> {
    for webhook in outbox::subscribers(conn, kind)? {
        on!(conn, |c| diesel::insert_into(o::table)
            .values((
                o::webhook_id.eq(webhook),
                o::kind.eq(kind),
                o::message_id.eq(Some(id)),
                o::at.eq(at),
                o::link_url.eq(url),
            ))
            .execute(c))?;
    }
    Ok(())
}

impl serde::Serialize for MessageStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The id and attributes (JSON text) of the recipient whose mailbox key
/// is `key`; `(None, "{}")` for an address on no list.
pub fn recipient_of_key(conn: &mut Conn, key: &str) -> Result<(Option<i64>, String)> {
    let found: Option<(i64, String)> = on!(conn, |c| r::table
        .filter(r::email_key.eq(key))
        .select((r::id, r::attributes))
        .first(c)
        .optional())?;
    Ok(match found {
        Some((id, attributes)) => (Some(id), attributes),
        None => (None, "{}".into()),
    })
}

/// How many messages the ledger holds.
pub fn count_all(conn: &mut Conn) -> Result<i64> {
    Ok(on!(conn, |c| m::table.count().get_result(c))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_names_the_statuses_of_a_claim() {
        assert_eq!(
            batch::HELD,
            [
                MessageStatus::Claimed.as_str(),
                MessageStatus::Sending.as_str()
            ]
        );
    }
}
