//! A job's messages claimed, marked, extended and recorded as a set, each
//! step in one write transaction (one commit for the batch rather than
//! one per message) and, but for the outcomes, in one statement (a
//! statement per message was most of a flow step's cost in the worker).
//! A claim is a token with a lease, held while the message is `claimed`
//! or `sending`.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::store::prepared::ids_json;
use crate::store::InnerMut;

mod outcomes;
pub use outcomes::{record, Outcome};

/// A message's status as an expression no index serves. A batch's
/// statements name their rows by id (`id IN (…)`, the primary key);
/// given a status term the index on (status, next_attempt_at) can
/// serve (a literal status in flight; a bound one cannot, the index
/// being partial), SQLite's planner chose that index for a list of 100
/// ids and read every queued message for each batch (10x a message's
/// cost at 100k queued; measured in BENCHMARKS.md). `status || ''`
/// keeps the filter and leaves the planner the primary key, whichever
/// way the status is written.
pub fn unindexed() -> diesel::dsl::Concat<m::status, &'static str> {
    m::status.concat("")
}

/// The statuses of a message a claim holds.
pub const HELD: [&str; 2] = ["claimed", "sending"];

/// Claim each of `ids` for `lease` ms under `token`: what each claim
/// found, in order.
pub fn claim(conn: &mut Conn, ids: &[i64], token: i64, lease: i64, now: i64) -> Result<Vec<Claim>> {
    conn.transaction(|c| {
        let got: Vec<Message> = match c.inner_mut() {
            InnerMut::Sqlite(x) => {
                let ids = ids_json(ids);
                Prepared::new(
                    CLAIM_SQLITE,
                    vec![
                        Bind::Text(MessageStatus::Claimed.as_str()),
                        Bind::Int(token),
                        Bind::Int(now + lease),
                        Bind::Json(&ids),
                        Bind::Text(MessageStatus::Queued.as_str()),
                        Bind::Text(MessageStatus::Claimed.as_str()),
                        Bind::Int(now),
                    ],
                )
                .load(x)?
            }
            InnerMut::Pg(x) => {
                let claimable = unindexed()
                    .eq(MessageStatus::Queued.as_str())
                    .or(unindexed()
                        .eq(MessageStatus::Claimed.as_str())
                        .and(m::claimed_until.lt(now)));
                diesel::update(m::table.filter(m::id.eq_any(ids)).filter(claimable))
                    .set((
                        m::status.eq(MessageStatus::Claimed),
                        m::claim_token.eq(Some(token)),
                        m::claimed_until.eq(now + lease),
                        m::attempts.eq(m::attempts + 1),
                    ))
                    .returning(Message::as_returning())
                    .get_results(x)?
            }
        };
        let mut mine: HashMap<i64, Message> = got.into_iter().map(|m| (m.id, m)).collect();
        ids.iter()
            .map(|&id| match mine.remove(&id) {
                Some(msg) => Ok(Claim::Mine(Box::new(msg))),
                None => not_claimed(c, id, now),
            })
            .collect()
    })
}

/// [`claim`] on SQLite: one fixed text, prepared once per connection
/// (diesel's `eq_any` makes a new text for each number of ids, parsed
/// anew every time), the ids as one JSON array.
const CLAIM_SQLITE: &str = "UPDATE messages SET status = ?, claim_token = ?, \
       claimed_until = ?, attempts = attempts + 1 \
     WHERE id IN (SELECT value FROM json_each(?)) \
       AND (status || '' = ? OR (status || '' = ? AND claimed_until < ?)) \
     RETURNING id, template_id, template_name, to_addr, data, idempotency_key, body_hash, \
       status, attempts, claim_token, claimed_until, reply, created_at, sent_at";

/// [`start_sending`]'s UPDATE on SQLite (see [`CLAIM_SQLITE`]).
const SENDING_SQLITE: &str = "UPDATE messages SET status = ? \
     WHERE id IN (SELECT value FROM json_each(?)) AND claim_token = ? AND status || '' = ?";

/// The claim holder is about to hand `ids` to the relay: each marked
/// `sending`, and whether its claim was still ours.
pub fn start_sending(conn: &mut Conn, ids: &[i64], token: i64) -> Result<Vec<bool>> {
    let held = m::claim_token.eq(Some(token));
    conn.transaction(|c| {
        let n = match c.inner_mut() {
            InnerMut::Sqlite(x) => {
                let json = ids_json(ids);
                Prepared::new(
                    SENDING_SQLITE,
                    vec![
                        Bind::Text(MessageStatus::Sending.as_str()),
                        Bind::Json(&json),
                        Bind::Int(token),
                        Bind::Text(MessageStatus::Claimed.as_str()),
                    ],
                )
                .execute(x)?
            }
            InnerMut::Pg(x) => diesel::update(
                m::table
                    .filter(m::id.eq_any(ids))
                    .filter(held)
                    .filter(unindexed().eq(MessageStatus::Claimed.as_str())),
            )
            .set(m::status.eq(MessageStatus::Sending))
            .execute(x)?,
        };
        if n == ids.len() {
            return Ok(vec![true; ids.len()]);
        }
        // Some claim was lost meanwhile (rare): ask which.
        let ours: HashSet<i64> = on!(c, |x| m::table
            .filter(m::id.eq_any(ids))
            .filter(held)
            .filter(unindexed().eq(MessageStatus::Sending.as_str()))
            .select(m::id)
            .load::<i64>(x))?
        .into_iter()
        .collect();
        Ok(ids.iter().map(|id| ours.contains(id)).collect())
    })
}

/// Push the lease of this token's claims (claimed or sending) on `ids`
/// to `now + lease`, while the worker is still at them: whether any is
/// still ours.
pub fn extend_claim(
    conn: &mut Conn,
    ids: &[i64],
    token: i64,
    lease: i64,
    now: i64,
) -> Result<bool> {
    let n = on!(conn, |c| diesel::update(
        m::table
            .filter(m::id.eq_any(ids))
            .filter(m::claim_token.eq(Some(token)))
            .filter(unindexed().eq_any(HELD))
    )
    .set(m::claimed_until.eq(now + lease))
    .execute(c))?;
    Ok(n > 0)
}
