//! A batch of messages inserted in one statement (the flow scheduler
//! stores a batch of due steps at a time): one INSERT whatever the
//! batch's size, where one per message was the biggest share of the
//! scheduler's writes. The rows travel as one value, a JSON array on
//! SQLite and column arrays on PostgreSQL, so the statement's text never
//! changes (prepared once per connection on SQLite). A message whose key
//! was used before is not inserted; it is then looked up as [`insert`]
//! does (a retry, rare: the scheduler stopped between storing a step and
//! moving its entry on).

use std::collections::HashMap;

use diesel::sql_types::{Array, BigInt, Nullable, Text};

use super::*;
use crate::store::InnerMut;

/// What an insert of a batch found for one message: the new row or the
/// one its key already named; `None`: the key was used for another body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filed {
    pub id: i64,
    pub status: MessageStatus,
    pub created_at: i64,
    /// False when the key named an earlier message.
    pub created: bool,
}

/// A row the batch's INSERT wrote.
#[derive(QueryableByName)]
struct Written {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    idempotency_key: Option<String>,
    #[diesel(sql_type = Text)]
    status: MessageStatus,
    #[diesel(sql_type = BigInt)]
    created_at: i64,
}

/// `json_extract`, not `->>` (SQLite 3.38; Debian 11 has 3.34). `WHERE
/// true`: SQLite's grammar needs it between an INSERT's SELECT and its
/// ON CONFLICT.
const INSERT_SQLITE: &str = "INSERT INTO messages (template_id, template_name, to_addr, data, \
     idempotency_key, body_hash, status, reply, created_at, next_attempt_at) \
     SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), \
       json_extract(value, '$[2]'), json_extract(value, '$[3]'), \
       json_extract(value, '$[4]'), json_extract(value, '$[5]'), \
       json_extract(value, '$[6]'), json_extract(value, '$[7]'), \
       json_extract(value, '$[8]'), json_extract(value, '$[8]') \
     FROM json_each(?) WHERE true \
     ON CONFLICT DO NOTHING RETURNING id, idempotency_key, status, created_at";

const INSERT_PG: &str = "INSERT INTO messages (template_id, template_name, to_addr, data, \
     idempotency_key, body_hash, status, reply, created_at, next_attempt_at) \
     SELECT u.template_id, u.template_name, u.to_addr, u.data, u.idempotency_key, \
       u.body_hash, u.status, u.reply, u.now, u.now \
     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
       $6::text[], $7::text[], $8::text[], $9::bigint[]) \
       AS u(template_id, template_name, to_addr, data, idempotency_key, body_hash, \
         status, reply, now) \
     ON CONFLICT DO NOTHING RETURNING id, idempotency_key, status, created_at";

/// Insert messages `rows` (each under an idempotency key of its own), or
/// find those their keys already name: what each found, in order. A row
/// without a key goes through [`insert`].
pub fn insert_many(conn: &mut Conn, rows: &[NewMessage]) -> Result<Vec<Option<Filed>>> {
    let keyed: Vec<&NewMessage> = rows
        .iter()
        .filter(|r| r.idempotency_key.is_some())
        .collect();
    let written = if keyed.is_empty() {
        Vec::new()
    } else {
        match conn.inner_mut() {
            InnerMut::Sqlite(c) => write_sqlite(c, &keyed),
            InnerMut::Pg(c) => write_pg(c, &keyed),
        }?
    };
    let mut by_key: HashMap<String, Written> = written
        .into_iter()
        .filter_map(|w| Some((w.idempotency_key.clone()?, w)))
        .collect();
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let new = row.idempotency_key.and_then(|k| by_key.remove(k));
        out.push(match new {
            Some(w) => Some(Filed {
                id: w.id,
                status: w.status,
                created_at: w.created_at,
                created: true,
            }),
            None => filed(insert(conn, row)?),
        });
    }
    Ok(out)
}

fn filed(inserted: Inserted) -> Option<Filed> {
    let (m, created) = match inserted {
        Inserted::New(m) => (m, true),
        Inserted::Again(m) => (m, false),
        Inserted::Conflict => return None,
    };
    Some(Filed {
        id: m.id,
        status: m.status,
        created_at: m.created_at,
        created,
    })
}

fn write_sqlite(
    c: &mut diesel::SqliteConnection,
    rows: &[&NewMessage],
) -> QueryResult<Vec<Written>> {
    let batch: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.template_id,
                r.template_name,
                r.to_addr,
                r.data,
                r.idempotency_key,
                r.body_hash,
                r.status.as_str(),
                r.reply,
                r.now,
            )
        })
        .collect();
    let json = serde_json::to_string(&batch)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    Prepared::new(INSERT_SQLITE, vec![Bind::Json(&json)]).load(c)
}

fn write_pg<'a>(
    c: &mut diesel::PgConnection,
    rows: &[&NewMessage<'a>],
) -> QueryResult<Vec<Written>> {
    let text = |f: fn(&NewMessage<'a>) -> &'a str| rows.iter().map(|r| f(r)).collect::<Vec<&str>>();
    diesel::sql_query(INSERT_PG)
        .bind::<Array<BigInt>, _>(rows.iter().map(|r| r.template_id).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(text(|r| r.template_name))
        .bind::<Array<Text>, _>(text(|r| r.to_addr))
        .bind::<Array<Text>, _>(text(|r| r.data))
        .bind::<Array<Nullable<Text>>, _>(
            rows.iter().map(|r| r.idempotency_key).collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(text(|r| r.body_hash))
        .bind::<Array<Text>, _>(text(|r| r.status.as_str()))
        .bind::<Array<Nullable<Text>>, _>(rows.iter().map(|r| r.reply).collect::<Vec<_>>())
        .bind::<Array<BigInt>, _>(rows.iter().map(|r| r.now).collect::<Vec<_>>())
        .load(c)
}
