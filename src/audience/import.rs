//! `mailsplit import`: stream a CSV file into the recipients table in
//! batched transactions. Rows are validated one by one; a bad row is reported
//! with its line number and skipped, never half-written. Memory is bounded by
//! one batch, however long the file.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::rc::Rc;
use std::str::FromStr;

use serde_json::{Map, Value};

use crate::audience::source::{RowResult, SourceError, SqlSource};
use crate::compose;
use crate::store::imports::Row;
use crate::store::recipients::RecipientStatus;
use crate::store::{Conn, StoreError};

mod sink;
mod writers;
use sink::Sink;

/// Rows written per transaction.
pub const BATCH_ROWS: usize = 2_000;
/// Longest accepted CSV record (and SQL source row); longer ones are
/// reported and skipped.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// Reserved columns; every other column becomes a template attribute.
const EMAIL: &str = "email";
const NAME: &str = "name";
const STATUS: &str = "status";

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is empty: its first line must be a header row naming the columns, one of them `email` (e.g. `email,name`)")]
    NoHeader { path: String },
    #[error("{path}: the header row has no `email` column (found: {found}); name the column that holds the addresses `email` (e.g. `email,name`)")]
    NoEmailColumn { path: String, found: String },
    #[error("the --from-sql query has no column named `email` (its columns: {found}); name the one that holds the addresses: SELECT customer_mail AS email, …")]
    NoEmailInQuery { found: String },
    #[error("{path}: the header row is {bytes} bytes long, over the limit of {MAX_RECORD_BYTES} bytes for any row; is the first line really a header of column names?")]
    HeaderTooLong { path: String, bytes: usize },
    #[error("{path}: cannot read the header row")]
    BadHeader {
        path: String,
        #[source]
        source: csv::Error,
    },
    #[error("{path}: read failed at line {line}")]
    Read {
        path: String,
        line: u64,
        #[source]
        source: csv::Error,
    },
    #[error("the source named nobody ({read} rows read, none imported): --sync would take all {members} members off list {list:?}; check the source, or pass --allow-empty to empty the list")]
    EmptySync {
        list: String,
        members: u64,
        read: u64,
    },
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ImportError {
    /// The file is not what `import` takes (exit code 2), as opposed to
    /// one that cannot be read or stored.
    pub fn is_usage(&self) -> bool {
        match self {
            ImportError::Source(e) => e.is_usage(),
            e => matches!(
                e,
                ImportError::NoHeader { .. }
                    | ImportError::NoEmailColumn { .. }
                    | ImportError::NoEmailInQuery { .. }
                    | ImportError::HeaderTooLong { .. }
                    | ImportError::EmptySync { .. }
            ),
        }
    }
}

/// Passes bytes through and notes the offset of every CR and LF, so a
/// record's byte offset can be turned into a line number.
struct LineIndex<R> {
    inner: R,
    offset: u64,
    newlines: Rc<RefCell<VecDeque<(u64, u8)>>>,
}

impl<R: Read> Read for LineIndex<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut q = self.newlines.borrow_mut();
        for (i, &b) in buf[..n].iter().enumerate() {
            if b == b'\n' || b == b'\r' {
                q.push_back((self.offset + i as u64, b));
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

/// A row that was not imported, and why (a duplicate is one too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub line: u64,
    pub reason: String,
}

/// How an import treats the list and its recipients.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Afterwards the list's members are exactly the rows imported.
    pub sync: bool,
    /// Rows saying active make active again recipients who are not.
    pub resubscribe: bool,
    /// `sync` may empty the list when the source names nobody.
    pub allow_empty: bool,
}

/// What an import did. `read` = added + updated + unchanged + skipped +
/// duplicates.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub read: u64,
    /// Rows whose recipient was not on the list before.
    pub added: u64,
    pub updated: u64,
    pub unchanged: u64,
    /// Members not in the source, taken off the list (`--sync` only).
    pub removed: u64,
    pub skipped: u64,
    pub duplicates: u64,
    /// Rows saying active (or nothing) for a recipient who is not,
    /// left as they were.
    pub kept_unsubscribed: u64,
}

/// Import `path` into `list`. `on_reject` hears about each skipped or
/// duplicate row as it is found (the CLI prints it); `on_progress` gets
/// the rows read so far; `on_wait` hears that another import of the list
/// is running, which this one waits for (one import of a list at a time).
pub fn import_file(
    conn: &mut Conn,
    path: &Path,
    list: &str,
    options: Options,
    mut on_reject: impl FnMut(&Rejected),
    mut on_progress: impl FnMut(u64),
    on_wait: &mut dyn FnMut(),
) -> Result<Summary, ImportError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ImportError::Open {
        path: shown.clone(),
        source,
    })?;
    let mut sink = Sink::new(conn, list, options, "line", &mut on_reject);
    sink.lock(on_wait)?;
    read_csv(&mut sink, file, &shown, &mut on_progress)?;
    sink.finish()
}

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

/// The columns of a CSV header that the import reads.
struct Columns {
    names: Vec<String>,
    email: usize,
    name: Option<usize>,
    status: Option<usize>,
}

/// Read the header row into [`Columns`].
fn read_header<R: Read>(reader: &mut csv::Reader<R>, shown: &str) -> Result<Columns, ImportError> {
    let headers = reader
        .byte_headers()
        .map_err(|source| ImportError::BadHeader {
            path: shown.to_string(),
            source,
        })?;
    if headers.is_empty() {
        return Err(ImportError::NoHeader {
            path: shown.to_string(),
        });
    }
    // The row limit holds for the header too: its column names are copied
    // into every row's attributes.
    if headers.as_slice().len() > MAX_RECORD_BYTES {
        return Err(ImportError::HeaderTooLong {
            path: shown.to_string(),
            bytes: headers.as_slice().len(),
        });
    }
    let names: Vec<String> = headers
        .iter()
        .map(|h| {
            String::from_utf8_lossy(h)
                .trim()
                .trim_start_matches('\u{feff}')
                .to_ascii_lowercase()
        })
        .collect();
    let Some(email) = names.iter().position(|c| c == EMAIL) else {
        return Err(ImportError::NoEmailColumn {
            path: shown.to_string(),
            found: names.join(", "),
        });
    };
    Ok(Columns {
        email,
        name: names.iter().position(|c| c == NAME),
        status: names.iter().position(|c| c == STATUS),
        names,
    })
}

fn read_csv(
    sink: &mut Sink<'_>,
    input: impl Read,
    shown: &str,
    on_progress: &mut dyn FnMut(u64),
) -> Result<(), ImportError> {
    let newlines = Rc::new(RefCell::new(VecDeque::new()));
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(LineIndex {
            inner: std::io::BufReader::with_capacity(1 << 16, input),
            offset: 0,
            newlines: Rc::clone(&newlines),
        });
    // The line a record starts on, from the offset where the csv reader
    // began it: skip the line ends (blank lines, the LF of a CRLF) found
    // there, then count the LFs before the first byte of the record. The csv
    // crate's own line numbers skip blank lines and miscount CRLF files.
    let mut lines_before = 0u64;
    let mut line_at = |byte: u64| {
        let mut q = newlines.borrow_mut();
        let mut at = byte;
        while let Some(&(offset, b)) = q.front() {
            if offset > at {
                break;
            }
            if offset == at {
                at += 1;
            }
            lines_before += u64::from(b == b'\n');
            q.pop_front();
        }
        lines_before + 1
    };
    let columns = read_header(&mut reader, shown)?;
    let mut record = csv::ByteRecord::new();
    loop {
        let start = reader.position().byte();
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {
                let line = line_at(record.position().map_or(start, |p| p.byte()));
                sink.row(line, parse_row(&record, &columns))?;
            }
            Err(e) if e.is_io_error() => {
                return Err(ImportError::Read {
                    path: shown.to_string(),
                    line: line_at(start),
                    source: e,
                })
            }
            // A malformed record: skip it and read on.
            Err(e) => {
                let at = e.position().map_or(start, |p| p.byte());
                sink.row(line_at(at), Err(e.to_string()))?;
            }
        }
        if sink.batch.rows.len() >= BATCH_ROWS {
            sink.flush()?;
            on_progress(sink.summary.read);
        }
    }
    on_progress(sink.summary.read);
    Ok(())
}

/// The attribute templates render as a link (`href`).
const LINK_ATTRIBUTE: &str = "unsubscribe_url";

/// Validate one record into a row, or say what is wrong with it. The row
/// holds only the columns the file has; an empty attribute clears its key.
fn parse_row(record: &csv::ByteRecord, columns: &Columns) -> Result<Row, String> {
    let names = &columns.names;
    if record.as_slice().len() > MAX_RECORD_BYTES {
        return Err(format!("row longer than {MAX_RECORD_BYTES} bytes"));
    }
    if record.len() != names.len() {
        return Err(format!(
            "has {} fields, the header has {}",
            record.len(),
            names.len()
        ));
    }
    let field = |i: usize| -> Result<&str, String> {
        std::str::from_utf8(&record[i])
            .map(str::trim)
            .map_err(|_| format!("column {:?} is not valid UTF-8", names[i]))
    };
    let email = normalise_email(field(columns.email)?)?;
    let email_key =
        crate::mailbox::key(&email).map_err(|e| format!("invalid email {email:?}: {e}"))?;
    let name = columns.name.map(field).transpose()?;
    if name.is_some_and(|n| n.chars().any(char::is_control)) {
        return Err("name contains control characters (CR, LF, …)".into());
    }
    let status = match columns.status {
        Some(i) => Some(RecipientStatus::from_input(field(i)?).map_err(|e| e.to_string())?),
        None => None,
    };
    let mut attributes = Map::new();
    for (i, column) in names.iter().enumerate() {
        if i == columns.email
            || Some(i) == columns.name
            || Some(i) == columns.status
            || column.is_empty()
        {
            continue;
        }
        let value = field(i)?;
        // A link a template renders must be http(s) or mailto (compose
        // checks again; this tells the user which row is wrong).
        if column == LINK_ATTRIBUTE && !value.is_empty() && compose::safe_link(value).is_none() {
            return Err(format!(
                "{LINK_ATTRIBUTE} must be an http(s) or mailto URL, got {value:?}"
            ));
        }
        let value = match value {
            "" => Value::Null,
            v => Value::String(v.to_string()),
        };
        attributes.insert(column.clone(), value);
    }
    Ok(Row {
        line: 0,
        email,
        email_key,
        name: name.map(str::to_string),
        attributes,
        status,
        new_id: None,
    })
}

/// Check an address the way the mailer will (lettre's parser, which accepts
/// internationalised domains and quoted local parts) and give it one
/// canonical spelling so re-imports match: the domain is lower-cased, the
/// local part kept as written.
pub fn normalise_email(raw: &str) -> Result<String, String> {
    if raw.is_empty() {
        return Err("email is empty".into());
    }
    if raw
        .chars()
        .any(|c| c.is_control() || c == '<' || c == '>' || c == ',')
    {
        return Err(format!("invalid email {raw:?}"));
    }
    let addr = lettre::Address::from_str(raw).map_err(|e| format!("invalid email {raw:?}: {e}"))?;
    // The local part exactly as written (a quoted one keeps its quotes, or
    // it would no longer parse); only the domain is folded.
    let local = raw.rsplit_once('@').map_or(addr.user(), |(local, _)| local);
    let canonical = format!("{local}@{}", addr.domain().to_lowercase());
    lettre::Address::from_str(&canonical).map_err(|e| format!("invalid email {raw:?}: {e}"))?;
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails() {
        assert_eq!(
            normalise_email("Ada@Example.COM").unwrap(),
            "Ada@example.com"
        );
        assert!(normalise_email("not-an-address").is_err());
        assert!(normalise_email("a@b.test\r\nBcc: victim@x.test").is_err());
        assert!(normalise_email("a@b.test, c@d.test").is_err());
        assert_eq!(
            normalise_email("\"quoted user\"@Example.test").unwrap(),
            "\"quoted user\"@example.test"
        );
        assert!(normalise_email("user@bücher.example").is_ok());
        assert!(normalise_email("").is_err());
    }
}
