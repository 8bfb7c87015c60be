//! Claiming a job's recipients in the ledger: a conditional write per
//! recipient, so only one worker ever holds one, and a dead worker's claim
//! is taken over once its lease runs out.

use std::sync::LazyLock;

use super::pg_fast::{claim_pg, DB_NOW_MS};
use super::*;
use crate::store::prepared::ids_json;

/// recipient, state, claim token, claimed until, attempts.
type ClaimRow = (i64, DeliveryState, Option<i64>, Option<i64>, i32);

/// The result of claiming a job's recipients.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Recipients this claim owns, with the attempt number this try is.
    pub owned: Vec<(i64, i32)>,
    /// Recipients already sent, failed or skipped: nothing to do.
    pub finished: usize,
    /// Some recipients are claimed by another live worker until this time
    /// (ms); the job must come back after it rather than be deleted.
    pub busy_until: Option<i64>,
}

/// A job's claim with what the worker needs to send it.
#[derive(Debug, Default)]
pub struct JobClaim {
    pub claim: Claim,
    /// The owned recipients, read with the claim (a recipient who bounced
    /// or left since enqueue is seen as such), in id order.
    pub people: Vec<Recipient>,
    /// How many of the job's ids are members of the list (each once).
    pub members: usize,
}

/// Claim a job: of `recipient_ids`, only the members of list `list_id` (a
/// job names recipient ids, and only the campaign's own list may be mailed,
/// whatever a job says), as [`claim`] does, and read the recipients it got.
/// Of their attributes, only those named in `keep` are read (all when
/// `None`). On PostgreSQL this is one prepared statement, one round trip;
/// on SQLite one read of the members with their rows, then the claim.
#[allow(clippy::too_many_arguments)]
pub fn claim_job(
    conn: &mut Conn,
    campaign_id: i64,
    list_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
    keep: Option<&[String]>,
) -> Result<JobClaim> {
    let members = match conn.inner_mut() {
        InnerMut::Pg(c) => {
            let keep = keep.map_or_else(|| "null".to_string(), crate::store::prepared::texts_json);
            let rows = claim_pg(
                c,
                Some(list_id),
                campaign_id,
                recipient_ids,
                token,
                lease_ms,
                &keep,
            )?;
            let members: Vec<i64> = rows.iter().map(|r| r.rid).collect();
            let (claim, people) = owned_rows(rows);
            let claim = settle(conn, claim, campaign_id, &members, token)?;
            return Ok(JobClaim {
                claim,
                people,
                members: members.len(),
            });
        }
        InnerMut::Sqlite(c) => members_sqlite(c, list_id, recipient_ids, keep)?,
    };
    let ids: Vec<i64> = members.iter().map(|m| m.rid).collect();
    let claim = claim(conn, campaign_id, &ids, token, lease_ms)?;
    let owned: HashSet<i64> = claim.owned.iter().map(|&(rid, _)| rid).collect();
    let people = members
        .into_iter()
        .filter(|m| owned.contains(&m.rid))
        .filter_map(|m| m.person.recipient(m.rid))
        .collect();
    Ok(JobClaim {
        claim,
        people,
        members: ids.len(),
    })
}

/// A member of the list among a job's ids, with its recipient's row.
#[derive(QueryableByName)]
struct MemberRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    rid: i64,
    #[diesel(embed)]
    person: PersonRow,
}

/// The members of list `list_id` among `ids` (each once, in id order),
/// each with its recipient's row as the worker needs it: of the
/// attributes only those named in `keep` (all when `None`). One statement
/// read before the claim, where a read of the members and another of the
/// owned recipients after it cost a statement's overhead per id twice (a
/// recipient who leaves between this read and the send is as one who
/// leaves just after it: the send checks nothing again either way).
fn members_sqlite(
    c: &mut diesel::sqlite::SqliteConnection,
    list_id: i64,
    ids: &[i64],
    keep: Option<&[String]>,
) -> Result<Vec<MemberRow>> {
    let ids = ids_json(ids);
    Ok(match keep {
        None => Prepared::new(
            &MEMBERS_SQLITE_ALL,
            vec![Bind::Int(list_id), Bind::Json(&ids)],
        )
        .load(c)?,
        Some(keep) => {
            let keys = crate::store::prepared::texts_json(keep);
            Prepared::new(
                &MEMBERS_SQLITE_KEEPING,
                vec![Bind::Json(&keys), Bind::Int(list_id), Bind::Json(&ids)],
            )
            .load(c)?
        }
    })
}

/// [`members_sqlite`]'s statement, with `attributes` the expression for
/// the recipient's attributes: a fixed text each, prepared once per
/// connection.
fn members_sql(attributes: &str) -> String {
    format!(
        "SELECT lm.recipient_id AS rid, r.email, r.name, {attributes} AS attributes, r.status \
         FROM list_members AS lm LEFT JOIN recipients AS r ON r.id = lm.recipient_id \
         WHERE lm.list_id = ? AND lm.recipient_id IN (SELECT value FROM json_each(?)) \
         ORDER BY lm.recipient_id"
    )
}
static MEMBERS_SQLITE_ALL: LazyLock<String> = LazyLock::new(|| members_sql("r.attributes"));
/// Only the attributes named (`?`, a JSON array): json_each gives true and
/// false as 1 and 0, made booleans again.
static MEMBERS_SQLITE_KEEPING: LazyLock<String> = LazyLock::new(|| {
    members_sql(
        "CASE WHEN r.id IS NULL THEN NULL ELSE \
           COALESCE((SELECT json_group_object(e.key, CASE e.type \
               WHEN 'true' THEN json('true') WHEN 'false' THEN json('false') \
               ELSE e.value END) \
             FROM json_each(r.attributes) AS e \
             WHERE e.key IN (SELECT value FROM json_each(?))), '{}') END",
    )
});

/// Split the PostgreSQL claim's rows into the recipients this claim owns
/// (a row with an attempt number) and those of them that were read whole.
fn owned_rows(rows: Vec<super::pg_fast::ClaimRowPg>) -> (Claim, Vec<Recipient>) {
    let mut claim = Claim::default();
    let mut people = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(attempts) = row.attempts else {
            continue;
        };
        claim.owned.push((row.rid, attempts));
        people.extend(row.person.recipient(row.rid));
    }
    (claim, people)
}

/// Claim every claimable recipient of a job for `token` until `now + lease`.
/// Claimable: never seen, waiting for a retry, or claimed by somebody whose
/// lease ran out (a dead worker).
pub fn claim(
    conn: &mut Conn,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
) -> Result<Claim> {
    let take = |conn: &mut Conn| {
        let owned = match conn.inner_mut() {
            InnerMut::Pg(c) => {
                claim_pg(c, None, campaign_id, recipient_ids, token, lease_ms, "null")?
                    .into_iter()
                    .filter_map(|r| Some((r.rid, r.attempts?)))
                    .collect()
            }
            InnerMut::Sqlite(c) => claim_sqlite(c, campaign_id, recipient_ids, token, lease_ms)?,
        };
        let claim = Claim {
            owned,
            ..Claim::default()
        };
        settle(conn, claim, campaign_id, recipient_ids, token)
    };
    match conn.backend() {
        // On PostgreSQL the claim is one statement, atomic by itself, and
        // the rare read after it gets a snapshot of its own either way (READ
        // COMMITTED): no BEGIN and COMMIT, two round trips fewer per job.
        Backend::Postgres => take(conn),
        // SQLite: three statements, one commit (and one fsync) for them.
        Backend::Sqlite => conn.transaction(take),
    }
}

/// SQLite cannot batch an upsert that says which rows it took: insert what
/// is new, take over rows waiting for a retry or left by a dead worker
/// (lease over), then read back what carries our token (the token is new
/// for every claim, so only this call's rows do). Anything else is left
/// alone. Returns what this claim got, with the attempt each is on.
fn claim_sqlite(
    c: &mut diesel::sqlite::SqliteConnection,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
    lease_ms: i64,
) -> Result<Vec<(i64, i32)>> {
    #[derive(QueryableByName)]
    struct Owned {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        rid: i64,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        attempts: i32,
    }
    let now = now_ms();
    let until = now + lease_ms;
    let ids = ids_json(recipient_ids);
    let inserted = Prepared::new(
        &CLAIM_SQLITE_NEW,
        vec![
            Bind::Int(campaign_id),
            Bind::Int(token),
            Bind::Int(until),
            Bind::Int(now),
            Bind::Json(&ids),
        ],
    )
    .execute(c)?;
    // A job's first try (the common case): every id got a new row, with
    // this token and attempt 1, so there is nothing to take over and
    // nothing to read back. Any id left out (a row already there, or the
    // same id twice) takes the full path.
    if inserted == recipient_ids.len() {
        return Ok(recipient_ids.iter().map(|&rid| (rid, 1)).collect());
    }
    Prepared::new(
        &CLAIM_SQLITE_TAKE_OVER,
        vec![
            Bind::Int(token),
            Bind::Int(until),
            Bind::Int(now),
            Bind::Int(campaign_id),
            Bind::Json(&ids),
            Bind::Int(now),
        ],
    )
    .execute(c)?;
    let owned: Vec<Owned> = Prepared::new(
        &CLAIM_SQLITE_OWNED,
        vec![Bind::Int(campaign_id), Bind::Json(&ids), Bind::Int(token)],
    )
    .load(c)?;
    Ok(owned.into_iter().map(|o| (o.rid, o.attempts)).collect())
}

/// [`claim_sqlite`]'s statements: fixed texts, so each connection prepares
/// them once (see [`crate::store::prepared`]); the ids are one JSON array.
static CLAIM_SQLITE_NEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT OR IGNORE INTO deliveries \
           (campaign_id, recipient_id, state, attempts, claim_token, claimed_until, updated_at) \
         SELECT ?, value, '{claimed}', 1, ?, ?, ? FROM json_each(?)",
        claimed = DeliveryState::Claimed.as_str()
    )
});

static CLAIM_SQLITE_TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE deliveries SET state = '{claimed}', attempts = attempts + 1, \
           claim_token = ?, claimed_until = ?, updated_at = ? \
         WHERE campaign_id = ? AND recipient_id IN (SELECT value FROM json_each(?)) \
           AND (state = '{retry}' OR (state = '{claimed}' AND claimed_until < ?))",
        claimed = DeliveryState::Claimed.as_str(),
        retry = DeliveryState::Retry.as_str()
    )
});

static CLAIM_SQLITE_OWNED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT recipient_id AS rid, attempts FROM deliveries \
         WHERE campaign_id = ? AND recipient_id IN (SELECT value FROM json_each(?)) \
           AND claim_token = ? AND state = '{claimed}'",
        claimed = DeliveryState::Claimed.as_str()
    )
});

/// Complete a claim: when it did not get every one of `recipient_ids`
/// (rare), say how many are finished and until when the others are held.
fn settle(
    conn: &mut Conn,
    mut claim: Claim,
    campaign_id: i64,
    recipient_ids: &[i64],
    token: i64,
) -> Result<Claim> {
    claim.owned.sort_unstable();
    if claim.owned.len() == recipient_ids.len() {
        return Ok(claim);
    }
    // Ask which: some are finished or held by another worker.
    let now = now_ms();
    let rows: Vec<ClaimRow> = on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .filter(d::recipient_id.eq_any(recipient_ids))
        .select((
            d::recipient_id,
            d::state,
            d::claim_token,
            d::claimed_until,
            d::attempts
        ))
        .load(c))?;
    for (rid, state, owner, claimed_until, attempts) in rows {
        match state {
            // Already ours from an earlier call with this token.
            DeliveryState::Claimed if owner == Some(token) => {
                if !claim.owned.iter().any(|&(r, _)| r == rid) {
                    claim.owned.push((rid, attempts));
                }
            }
            DeliveryState::Claimed | DeliveryState::Retry => {
                let until = claimed_until.unwrap_or(now).max(now);
                claim.busy_until = Some(claim.busy_until.map_or(until, |b| b.max(until)));
            }
            _ => claim.finished += 1,
        }
    }
    Ok(claim)
}

/// Push back the lease on everything `token` still holds (a long job).
pub fn extend_claims(
    conn: &mut Conn,
    campaign_id: i64,
    token: i64,
    lease_ms: i64,
) -> Result<usize> {
    use diesel::sql_types::{BigInt, Nullable};
    let mine = || {
        d::table
            .filter(d::campaign_id.eq(campaign_id))
            .filter(d::claim_token.eq(Some(token)))
            .filter(d::state.eq(DeliveryState::Claimed))
    };
    Ok(match conn.inner_mut() {
        // On the database's clock, like the claim (see `DB_NOW_MS`).
        InnerMut::Pg(c) => {
            let until = diesel::dsl::sql::<Nullable<BigInt>>(&format!("({DB_NOW_MS}) + "))
                .bind::<BigInt, _>(lease_ms);
            diesel::update(mine())
                .set(d::claimed_until.eq(until))
                .execute(c)?
        }
        InnerMut::Sqlite(c) => diesel::update(mine())
            .set(d::claimed_until.eq(Some(now_ms() + lease_ms)))
            .execute(c)?,
    })
}
