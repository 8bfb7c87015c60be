//! The queries behind `mailsplit report`: GROUP BYs over one campaign's
//! rows of the ledger (reached through its primary key, whose first column
//! is the campaign), its bounce events (`bounces_by_campaign`, migration
//! 65) and its content versions. Each returns a bounded number of rows.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};

use super::{on, Backend, Conn, DeliveryState, RecipientStatus, Result};

/// Outcomes of the campaign's recipients at one domain.
#[derive(Debug, Clone, QueryableByName)]
pub struct DomainRow {
    #[diesel(sql_type = Text)]
    pub domain: String,
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = BigInt)]
    pub n: i64,
    #[diesel(sql_type = BigInt)]
    pub bounced: i64,
    #[diesel(sql_type = BigInt)]
    pub complained: i64,
    /// Recipients who left by this campaign's one-click link.
    #[diesel(sql_type = BigInt)]
    pub unsubscribed: i64,
}

/// One distinct reason text and how often it came.
#[derive(Debug, Clone, QueryableByName)]
pub struct ReasonRow {
    #[diesel(sql_type = Nullable<Text>)]
    pub status: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub reason: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// Outcomes finished in one minute.
#[derive(Debug, Clone, QueryableByName)]
pub struct MinuteRow {
    /// Minutes since the Unix epoch.
    #[diesel(sql_type = BigInt)]
    pub minute: i64,
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// `sql` with `?` placeholders as the backend spells them (`$1`, … on
/// PostgreSQL).
fn placeholders(conn: &Conn, sql: &str) -> String {
    if conn.backend() == Backend::Sqlite {
        return sql.to_string();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for ch in sql.chars() {
        if ch == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(ch);
        }
    }
    out
}

/// The reason `serve` stores with a one-click unsubscribe from a campaign.
pub fn unsubscribe_reason(campaign_id: i64) -> String {
    format!("one-click unsubscribe (campaign {campaign_id})")
}

/// Every (domain, state) of the campaign's ledger with its counts: one
/// scan of the campaign's rows joined to their recipients.
pub fn by_domain(conn: &mut Conn, campaign_id: i64) -> Result<Vec<DomainRow>> {
    let domain = match conn.backend() {
        Backend::Postgres => "lower(split_part(r.email, '@', 2))",
        Backend::Sqlite => "lower(substr(r.email, instr(r.email, '@') + 1))",
    };
    let sql = format!(
        "SELECT {domain} AS domain, d.state AS state, count(*) AS n, \
           count(d.bounced_at) AS bounced, count(d.complained_at) AS complained, \
           sum(CASE WHEN r.status = '{unsub}' AND r.status_reason = ? THEN 1 ELSE 0 END) AS unsubscribed \
         FROM deliveries d JOIN recipients r ON r.id = d.recipient_id \
         WHERE d.campaign_id = ? GROUP BY 1, 2",
        unsub = RecipientStatus::Unsubscribed.as_str()
    );
    let reason = unsubscribe_reason(campaign_id);
    let sql = placeholders(conn, &sql);
    Ok(on!(conn, |c| diesel::sql_query(&sql)
        .bind::<Text, _>(&reason)
        .bind::<BigInt, _>(campaign_id)
        .load(c))?)
}

/// The relay's replies to the campaign's failed deliveries, most frequent
/// first, at most `limit` distinct texts.
pub fn failure_replies(conn: &mut Conn, campaign_id: i64, limit: i64) -> Result<Vec<ReasonRow>> {
    let sql = format!(
        "SELECT CAST(NULL AS TEXT) AS status, last_error AS reason, count(*) AS n FROM deliveries \
         WHERE campaign_id = ? AND state = '{}' GROUP BY last_error ORDER BY n DESC LIMIT ?",
        DeliveryState::Failed.as_str()
    );
    let sql = placeholders(conn, &sql);
    Ok(on!(conn, |c| diesel::sql_query(&sql)
        .bind::<BigInt, _>(campaign_id)
        .bind::<BigInt, _>(limit)
        .load(c))?)
}

/// Why the campaign's skipped deliveries were skipped (`unsubscribed`,
/// `suppressed: REASON`, …), most frequent first, at most `limit` texts.
pub fn skip_reasons(conn: &mut Conn, campaign_id: i64, limit: i64) -> Result<Vec<ReasonRow>> {
    let sql = format!(
        "SELECT CAST(NULL AS TEXT) AS status, last_error AS reason, count(*) AS n FROM deliveries \
         WHERE campaign_id = ? AND state = '{}' GROUP BY last_error ORDER BY n DESC, last_error LIMIT ?",
        DeliveryState::Skipped.as_str()
    );
    let sql = placeholders(conn, &sql);
    Ok(on!(conn, |c| diesel::sql_query(&sql)
        .bind::<BigInt, _>(campaign_id)
        .bind::<BigInt, _>(limit)
        .load(c))?)
}

/// Bounce reports received later (not the send-time refusals the ledger
/// already has), by status and reason, most frequent first.
pub fn reported_bounces(conn: &mut Conn, campaign_id: i64, limit: i64) -> Result<Vec<ReasonRow>> {
    use super::bounces::{BounceKind as K, BounceSource};
    let sql = format!(
        "SELECT status, reason, count(*) AS n FROM bounces \
         WHERE campaign_id = ? AND source <> '{}' AND kind IN ('{}', '{}', '{}') \
         GROUP BY status, reason ORDER BY n DESC LIMIT ?",
        BounceSource::Smtp.as_str(),
        K::Hard.as_str(),
        K::Soft.as_str(),
        K::Policy.as_str()
    );
    let sql = placeholders(conn, &sql);
    Ok(on!(conn, |c| diesel::sql_query(&sql)
        .bind::<BigInt, _>(campaign_id)
        .bind::<BigInt, _>(limit)
        .load(c))?)
}

/// Finished outcomes per minute (by the time the ledger row became final).
pub fn per_minute(conn: &mut Conn, campaign_id: i64) -> Result<Vec<MinuteRow>> {
    let sql = format!(
        "SELECT updated_at / 60000 AS minute, state, count(*) AS n FROM deliveries \
         WHERE campaign_id = ? AND state IN ('{}', '{}') GROUP BY 1, 2 ORDER BY 1",
        DeliveryState::Sent.as_str(),
        DeliveryState::Failed.as_str()
    );
    let sql = placeholders(conn, &sql);
    Ok(on!(conn, |c| diesel::sql_query(&sql)
        .bind::<BigInt, _>(campaign_id)
        .load(c))?)
}
