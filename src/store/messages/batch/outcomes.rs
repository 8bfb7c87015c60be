//! A batch's outcomes recorded by one UPDATE: the rows travel as one
//! value (a JSON array on SQLite, read by `json_each`; column arrays on
//! PostgreSQL, read by `unnest`), so the statement's text never changes
//! and SQLite prepares it once per connection. One prepared UPDATE per
//! message was the largest of a flow message's statements in the worker.

use std::collections::HashSet;

use diesel::sql_types::{Array, BigInt, Nullable, Text};

use super::super::*;
use crate::store::InnerMut;

/// One outcome of a batch: message, status, the relay's reply.
pub type Outcome = (i64, MessageStatus, Option<String>);

/// Each row is `[id, status, reply, sent_at]`. `json_extract`, not `->>`
/// (SQLite 3.38; Debian 11 has 3.34). The planner reads the array and
/// finds each message by its primary key; the status filter is on
/// `status || ''`, which no index serves (see [`super::unindexed`]).
const RECORD_SQLITE: &str = "UPDATE messages SET status = json_extract(v.value, '$[1]'), \
       reply = json_extract(v.value, '$[2]'), sent_at = json_extract(v.value, '$[3]') \
     FROM json_each(?) AS v \
     WHERE messages.id = json_extract(v.value, '$[0]') AND messages.claim_token = ? \
       AND messages.status || '' IN (?, ?) \
     RETURNING messages.id AS id";

const RECORD_PG: &str = "UPDATE messages SET status = u.status, reply = u.reply, \
       sent_at = u.sent_at \
     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[]) \
       AS u(id, status, reply, sent_at) \
     WHERE messages.id = u.id AND messages.claim_token = $5 \
       AND messages.status || '' IN ($6, $7) \
     RETURNING messages.id AS id";

/// A row the UPDATE changed.
#[derive(QueryableByName)]
struct Changed {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Record what became of each claimed message: a final status (with
/// the webhook event in the same transaction), or `Queued` to try
/// again; whether the claim was still ours.
pub fn record(conn: &mut Conn, outcomes: &[Outcome], token: i64, now: i64) -> Result<Vec<bool>> {
    let mut ids = HashSet::with_capacity(outcomes.len());
    let distinct = outcomes.iter().all(|(id, _, _)| ids.insert(*id));
    conn.transaction(|c| {
        if !distinct {
            // One message twice in a batch (never in the worker's own
            // batches): in order, one at a time, the second finding the
            // first's status.
            return outcomes
                .iter()
                .map(|(id, status, reply)| {
                    record_in(c, (*id, token), *status, reply.as_deref(), now)
                })
                .collect();
        }
        let changed = write(c, outcomes, token, now)?;
        for (id, status, _) in outcomes.iter().filter(|(id, ..)| changed.contains(id)) {
            let kind = match status {
                MessageStatus::Sent => EventKind::Sent,
                MessageStatus::Failed => EventKind::Failed,
                _ => continue,
            };
            event(c, kind, *id, now)?;
        }
        Ok(outcomes
            .iter()
            .map(|(id, ..)| changed.contains(id))
            .collect())
    })
}

/// The UPDATE itself: the ids it changed (those whose claim `token`
/// still held).
fn write(conn: &mut Conn, outcomes: &[Outcome], token: i64, now: i64) -> Result<HashSet<i64>> {
    let sent_at = |status: MessageStatus| (status == MessageStatus::Sent).then_some(now);
    let (claimed, sending) = (
        MessageStatus::Claimed.as_str(),
        MessageStatus::Sending.as_str(),
    );
    let changed: Vec<Changed> = match conn.inner_mut() {
        InnerMut::Sqlite(c) => {
            let rows: Vec<_> = outcomes
                .iter()
                .map(|(id, status, reply)| (id, status.as_str(), reply, sent_at(*status)))
                .collect();
            let json = serde_json::to_string(&rows)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            Prepared::new(
                RECORD_SQLITE,
                vec![
                    Bind::Json(&json),
                    Bind::Int(token),
                    Bind::Text(claimed),
                    Bind::Text(sending),
                ],
            )
            .load(c)?
        }
        InnerMut::Pg(c) => diesel::sql_query(RECORD_PG)
            .bind::<Array<BigInt>, _>(outcomes.iter().map(|o| o.0).collect::<Vec<_>>())
            .bind::<Array<Text>, _>(outcomes.iter().map(|o| o.1.as_str()).collect::<Vec<_>>())
            .bind::<Array<Nullable<Text>>, _>(
                outcomes.iter().map(|o| o.2.as_deref()).collect::<Vec<_>>(),
            )
            .bind::<Array<Nullable<BigInt>>, _>(
                outcomes.iter().map(|o| sent_at(o.1)).collect::<Vec<_>>(),
            )
            .bind::<BigInt, _>(token)
            .bind::<Text, _>(claimed)
            .bind::<Text, _>(sending)
            .load(c)?,
    };
    Ok(changed.into_iter().map(|c| c.id).collect())
}
