//! Flows started by a query on the shop's own database (`flow create …
//! --trigger-sql QUERY --source URL --every 5m`). The source is the
//! import's ([`crate::audience::source`]): one read-only statement, a
//! privileged user refused, each row capped. The scheduler (the lease
//! holder) polls each flow every `--every`, and at once when one of its
//! steps is due, so a step goes out only on rows read after it fell due.
//! Rows stream: a thread reads the source a page ahead of the writes (a
//! bounded channel), and each page enters in one transaction. Each row
//! (`email`, `key`, other columns as `row.COL`) enters once per (email,
//! key); an entry the last complete poll did not return leaves when its
//! step is due (`no longer matched`: the cart was bought).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::FlowError;
use crate::audience::import::{normalise_email, MAX_RECORD_BYTES};
use crate::audience::source::{self, RowResult, SourceError, SqlSource};
use crate::store::flow_sql::{self as store, SqlRow};
use crate::store::flows::{self as flows_store, Flow, FlowState};
use crate::store::{now_ms, Db};

/// The reason an entry leaves when the query stopped returning it.
pub const NO_LONGER_MATCHED: &str = "no longer matched";
/// The shortest `--every`.
pub const MIN_EVERY_MS: i64 = 1_000;
/// Rows per page: written in one transaction each.
const PAGE: usize = 500;
/// Pages read ahead of the writes.
const AHEAD: usize = 2;

/// The columns a trigger query must return.
const EMAIL: &str = "email";
const KEY: &str = "key";

/// How a flow reads its source.
fn options(allow_privileged: bool) -> source::Options {
    source::Options {
        allow_privileged,
        max_row_bytes: MAX_RECORD_BYTES,
    }
}

/// Open the source and check the query (one read-only statement,
/// columns `email` and `key`) before the flow is stored; nothing is read.
pub fn check(url: &str, query: &str, allow_privileged: bool) -> Result<(), FlowError> {
    let source = SqlSource::open(url, query, options(allow_privileged))?;
    let has = |name: &str| {
        source
            .columns()
            .iter()
            .any(|c| c.eq_ignore_ascii_case(name))
    };
    if !has(EMAIL) || !has(KEY) {
        return Err(FlowError::TriggerColumns(source.columns().join(", ")));
    }
    Ok(())
}

/// Poll the SQL flows that are due: every `--every`, and at once when an
/// active flow has a step due. A failed poll is logged and tried again
/// at the next tick that finds it due.
pub async fn poll_due(db: &Arc<Db>) -> Result<(), FlowError> {
    let flows = db.run(store::sql_flows).await?;
    for flow in flows {
        let now = now_ms();
        let every = flow.every_ms.unwrap_or(MIN_EVERY_MS).max(MIN_EVERY_MS);
        let id = flow.id;
        let stepping =
            flow.state == FlowState::Active && db.run(move |c| store::has_due(c, id, now)).await?;
        if now - flow.polled_at < every && !stepping {
            continue;
        }
        let was = flow.polled_at;
        if !db.run(move |c| store::claim_poll(c, id, was, now)).await? {
            continue;
        }
        let name = flow.name.clone();
        match poll(db, flow, now).await {
            Ok(n) if n.entered > 0 => {
                tracing::info!(flow = %name, entered = n.entered, new_recipients = n.recipients,
                    skipped = n.skipped, "flow trigger: rows entered")
            }
            Ok(n) if n.skipped > 0 => {
                tracing::warn!(flow = %name, skipped = n.skipped, reason = %n.first_skip,
                    "flow trigger: rows skipped")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(flow = %name, error = %e, "flow trigger: poll failed"),
        }
    }
    Ok(())
}

/// What one poll did.
#[derive(Debug, Default)]
pub struct Polled {
    pub entered: u64,
    pub recipients: u64,
    /// Rows refused (no address, no key, over the size cap), and why the
    /// first one was.
    pub skipped: u64,
    pub first_skip: String,
}

/// Read flow `flow`'s query once (the poll beginning at `t`) and enter
/// its rows; mark the flow matched at `t` once every row is read.
pub async fn poll(db: &Arc<Db>, flow: Flow, t: i64) -> Result<Polled, FlowError> {
    let (Some(url), Some(query)) = (flow.sql_source.clone(), flow.sql_query.clone()) else {
        return Ok(Polled::default());
    };
    let id = flow.id;
    let first = db
        .run(move |c| flows_store::steps(c, id))
        .await?
        .first()
        .map_or(0, |s| s.delay_ms);
    let (pages, mut ahead) = tokio::sync::mpsc::channel::<Vec<RowResult>>(AHEAD);
    let allow = flow.allow_privileged;
    let reader = tokio::task::spawn_blocking(move || read(&url, &query, allow, pages));
    let mut done = Polled::default();
    while let Some(page) = ahead.recv().await {
        let mut rows = Vec::with_capacity(page.len());
        for row in page {
            match row.and_then(entry_row) {
                Ok(r) => rows.push(r),
                Err(reason) => {
                    if done.skipped == 0 {
                        done.first_skip = reason;
                    }
                    done.skipped += 1;
                }
            }
        }
        let n = db
            .run(move |c| store::enter_rows(c, id, first, t, &rows))
            .await?;
        done.entered += n.entered;
        done.recipients += n.recipients;
    }
    match reader.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(SourceError::Fetch("the source reader panicked".into()).into()),
    }
    db.run(move |c| store::matched(c, id, t)).await?;
    Ok(done)
}

/// The source reader: every row, a page at a time, into `pages`; stops
/// early if the writer is gone.
fn read(
    url: &str,
    query: &str,
    allow_privileged: bool,
    pages: tokio::sync::mpsc::Sender<Vec<RowResult>>,
) -> Result<(), SourceError> {
    let mut source = SqlSource::open(url, query, options(allow_privileged))?;
    let mut page = Vec::with_capacity(PAGE);
    let gone = || SourceError::Fetch("the flow scheduler stopped reading".into());
    source.rows(|row| {
        page.push(row);
        if page.len() == PAGE {
            let full = std::mem::replace(&mut page, Vec::with_capacity(PAGE));
            pages.blocking_send(full).map_err(|_| gone())?;
        }
        Ok::<_, SourceError>(())
    })?;
    if !page.is_empty() {
        pages.blocking_send(page).map_err(|_| gone())?;
    }
    Ok(())
}

/// One source row as an entry: `email` (checked and spelt as an import
/// would) and `key` (text; a number as its digits) required; the whole
/// row is what the step templates see as `row`.
fn entry_row(map: Map<String, Value>) -> Result<SqlRow, String> {
    let text = |name: &str| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| match v {
                Value::String(s) => Some(s.trim().to_string()),
                Value::Null => None,
                other => Some(other.to_string()),
            })
    };
    let email = normalise_email(&text(EMAIL).unwrap_or_default())?;
    let email_key =
        crate::mailbox::key(&email).map_err(|e| format!("invalid email {email:?}: {e}"))?;
    let key = text(KEY)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| format!("row for {email} has no key"))?;
    let name = text("name").filter(|n| !n.chars().any(char::is_control));
    let data = serde_json::to_string(&map).map_err(|e| e.to_string())?;
    Ok(SqlRow {
        email,
        email_key,
        name,
        key,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_need_an_address_and_a_key() {
        let row = |v: Value| entry_row(v.as_object().unwrap().clone());
        let r =
            row(serde_json::json!({"EMAIL": "Ada@Example.TEST", "key": 7, "total": 19.9})).unwrap();
        assert_eq!(
            (r.email.as_str(), r.key.as_str()),
            ("Ada@example.test", "7")
        );
        assert!(r.data.contains("\"total\":19.9"), "{}", r.data);
        assert!(row(serde_json::json!({"email": "a@b.test"})).is_err());
        assert!(row(serde_json::json!({"email": "a@b.test", "key": null})).is_err());
        assert!(row(serde_json::json!({"email": "nope", "key": "1"})).is_err());
    }
}
