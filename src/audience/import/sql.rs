//! `import --from-sql`: the rows of the shop's own database, read on a
//! thread of their own a few pages ahead of the writes, each turned into a
//! row to import under the same rules as a CSV line.

use serde_json::{Map, Value};

use super::sink::Sink;
use super::{
    normalise_email, ImportError, Options, Rejected, Summary, BATCH_ROWS, EMAIL, LINK_ATTRIBUTE,
    NAME, STATUS,
};
use crate::audience::source::{RowResult, SourceError, SqlSource};
use crate::compose;
use crate::store::imports::Row;
use crate::store::recipients::RecipientStatus;
use crate::store::Conn;

/// Import the rows of an SQL source (see [`crate::audience::source`]) into `list`,
/// under the same rules as a file; rows are numbered from 1 for reports.
pub fn import_sql(
    conn: &mut Conn,
    source: &mut SqlSource,
    list: &str,
    options: Options,
    mut on_reject: impl FnMut(&Rejected),
    mut on_progress: impl FnMut(u64),
    on_wait: &mut dyn FnMut(),
) -> Result<Summary, ImportError> {
    if !source
        .columns()
        .iter()
        .any(|c| c.eq_ignore_ascii_case(EMAIL))
    {
        return Err(ImportError::NoEmailInQuery {
            found: source.columns().join(", "),
        });
    }
    let mut sink = Sink::new(conn, list, options, "row", &mut on_reject);
    sink.lock(on_wait)?;
    // The source is read on a thread of its own, a few pages ahead, so its
    // round trips and the parsing of its rows overlap the writes (1M rows
    // from PostgreSQL into SQLite: BENCHMARKS.md, import compare); the
    // channel bounds what is read ahead.
    std::thread::scope(|scope| {
        let (pages, ahead) = std::sync::mpsc::sync_channel::<Vec<RowResult>>(READ_AHEAD);
        let reader = scope.spawn(move || {
            let mut page = Vec::with_capacity(READ_PAGE);
            source.rows(|row| {
                page.push(row);
                if page.len() == READ_PAGE {
                    let full = std::mem::replace(&mut page, Vec::with_capacity(READ_PAGE));
                    pages.send(full).map_err(|_| Reading::Stopped)?;
                }
                Ok::<_, Reading>(())
            })?;
            pages.send(page).map_err(|_| Reading::Stopped)
        });
        let written = write_pages(&mut sink, ahead, &mut on_progress);
        // The reader stops at its next page once `ahead` is dropped.
        let read = reader.join().unwrap_or_else(|_| {
            Err(Reading::Source(SourceError::Fetch(
                "the source reader panicked".into(),
            )))
        });
        written?;
        match read {
            Ok(()) | Err(Reading::Stopped) => Ok(()),
            Err(Reading::Source(e)) => Err(ImportError::Source(e)),
        }
    })?;
    on_progress(sink.summary.read);
    sink.finish()
}

/// Source rows read ahead, at most this many pages of [`READ_PAGE`].
const READ_AHEAD: usize = 4;
const READ_PAGE: usize = 500;

/// Why the source reader stopped early.
enum Reading {
    Source(SourceError),
    /// The writer is gone (it failed): nothing more to read for.
    Stopped,
}

impl From<SourceError> for Reading {
    fn from(e: SourceError) -> Self {
        Reading::Source(e)
    }
}

/// Write the pages the source reader sends until it is done or a write
/// fails (which drops `pages`, and so stops the reader).
fn write_pages(
    sink: &mut Sink,
    pages: std::sync::mpsc::Receiver<Vec<RowResult>>,
    on_progress: &mut impl FnMut(u64),
) -> Result<(), ImportError> {
    let mut n = 0u64;
    for page in pages {
        for row in page {
            n += 1;
            sink.row(n, row.and_then(sql_row))?;
            if sink.batch.rows.len() >= BATCH_ROWS {
                sink.flush()?;
                on_progress(sink.summary.read);
            }
        }
    }
    Ok(())
}

/// One source row (a JSON object from the source database) as a row to
/// import: `email` required, `name` and `status` optional; every other
/// column an attribute with its type kept, NULL leaving it out.
fn sql_row(map: Map<String, Value>) -> Result<Row, String> {
    let mut email = None;
    let mut name = None;
    let mut status = None;
    let mut attributes = Map::new();
    for (column, value) in map {
        let column = column.trim().to_ascii_lowercase();
        let text = || match &value {
            Value::String(s) => Some(s.trim().to_string()),
            Value::Null => None,
            other => Some(other.to_string()),
        };
        match column.as_str() {
            EMAIL => email = text(),
            NAME => name = text(),
            STATUS => status = text(),
            "" => {}
            _ if value.is_null() => {}
            _ => {
                if let (LINK_ATTRIBUTE, Value::String(v)) = (column.as_str(), &value) {
                    if !v.is_empty() && compose::safe_link(v).is_none() {
                        return Err(format!(
                            "{LINK_ATTRIBUTE} must be an http(s) or mailto URL, got {v:?}"
                        ));
                    }
                }
                attributes.insert(column, value);
            }
        }
    }
    let email = normalise_email(email.as_deref().unwrap_or(""))?;
    let email_key =
        crate::mailbox::key(&email).map_err(|e| format!("invalid email {email:?}: {e}"))?;
    if name
        .as_deref()
        .is_some_and(|n| n.chars().any(char::is_control))
    {
        return Err("name contains control characters (CR, LF, …)".into());
    }
    let status = status
        .map(|s| RecipientStatus::from_input(&s).map_err(|e| e.to_string()))
        .transpose()?;
    Ok(Row {
        line: 0,
        email,
        email_key,
        name,
        attributes,
        status,
        new_id: None,
    })
}
