//! `mailsplit import`: stream a CSV file into the recipients table in
//! batched transactions. Rows are validated one by one; a bad row is reported
//! with its line number and skipped, never half-written. Memory is bounded by
//! one batch, however long the file.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::path::Path;
use std::rc::Rc;
use std::str::FromStr;

use serde_json::{Map, Value};

use crate::compose;
use crate::store::recipients::{self, NewRecipient, RecipientStatus, UpsertCounts};
use crate::store::{now_ms, Conn, StoreError};

/// Rows written per transaction.
pub const BATCH_ROWS: usize = 2_000;
/// Longest accepted CSV record; longer lines are reported and skipped.
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
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ImportError {
    /// The file is not what `import` takes (exit code 2), as opposed to
    /// one that cannot be read or stored.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ImportError::NoHeader { .. }
                | ImportError::NoEmailColumn { .. }
                | ImportError::HeaderTooLong { .. }
        )
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

/// A row that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub line: u64,
    pub reason: String,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub imported: u64,
    pub updated: u64,
    pub skipped: u64,
}

/// Import `path` into `list`. `on_reject` hears about each skipped row as it
/// is found (the CLI prints it); `on_progress` gets the rows read so far.
pub fn import_file(
    conn: &mut Conn,
    path: &Path,
    list: &str,
    mut on_reject: impl FnMut(&Rejected),
    mut on_progress: impl FnMut(u64),
) -> Result<Summary, ImportError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ImportError::Open {
        path: shown.clone(),
        source,
    })?;
    import_reader(conn, file, &shown, list, &mut on_reject, &mut on_progress)
}

fn import_reader(
    conn: &mut Conn,
    input: impl Read,
    shown: &str,
    list: &str,
    on_reject: &mut dyn FnMut(&Rejected),
    on_progress: &mut dyn FnMut(u64),
) -> Result<Summary, ImportError> {
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
    let headers = reader
        .byte_headers()
        .map_err(|source| ImportError::BadHeader {
            path: shown.to_string(),
            source,
        })?
        .clone();
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
    let columns: Vec<String> = headers
        .iter()
        .map(|h| {
            String::from_utf8_lossy(h)
                .trim()
                .trim_start_matches('\u{feff}')
                .to_ascii_lowercase()
        })
        .collect();
    let Some(email_col) = columns.iter().position(|c| c == EMAIL) else {
        return Err(ImportError::NoEmailColumn {
            path: shown.to_string(),
            found: columns.join(", "),
        });
    };
    let name_col = columns.iter().position(|c| c == NAME);
    let status_col = columns.iter().position(|c| c == STATUS);

    let list_id = recipients::get_or_create_list(conn, list)?;
    let mut summary = Summary::default();
    // In file order (new recipients get ids in that order), with an index by
    // mailbox so a batch never names one recipient twice: the last row wins,
    // as it would across batches.
    let mut batch = Batch::default();
    let mut record = csv::ByteRecord::new();
    let mut rows = 0u64;
    loop {
        let start = reader.position().byte();
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) if e.is_io_error() => {
                return Err(ImportError::Read {
                    path: shown.to_string(),
                    line: line_at(start),
                    source: e,
                })
            }
            Err(e) => {
                // A malformed record: skip it and read on.
                summary.skipped += 1;
                let at = e.position().map_or(start, |p| p.byte());
                on_reject(&Rejected {
                    line: line_at(at),
                    reason: e.to_string(),
                });
                continue;
            }
        }
        rows += 1;
        let line = line_at(record.position().map_or(start, |p| p.byte()));
        match parse_row(&record, &columns, email_col, name_col, status_col) {
            Ok(row) => batch.push(row),
            Err(reason) => {
                summary.skipped += 1;
                on_reject(&Rejected { line, reason });
            }
        }
        if batch.rows.len() >= BATCH_ROWS {
            add(
                &mut summary,
                flush(conn, list_id, &mut batch, status_col.is_some())?,
            );
            on_progress(rows);
        }
    }
    add(
        &mut summary,
        flush(conn, list_id, &mut batch, status_col.is_some())?,
    );
    on_progress(rows);
    // The tables may have grown by orders of magnitude: let the planner
    // know before enqueue pages through them.
    conn.refresh_statistics(&["recipients", "list_members"])?;
    Ok(summary)
}

fn add(summary: &mut Summary, counts: UpsertCounts) {
    summary.imported += counts.inserted;
    summary.updated += counts.updated;
}

#[derive(Default)]
struct Batch {
    rows: Vec<NewRecipient>,
    by_key: HashMap<String, usize>,
}

impl Batch {
    fn push(&mut self, row: NewRecipient) {
        match self.by_key.get(&row.email_key) {
            // Another spelling of a mailbox seen earlier in this batch: its
            // data, the first spelling (as across batches).
            Some(&i) => {
                let email = std::mem::take(&mut self.rows[i].email);
                self.rows[i] = NewRecipient { email, ..row };
            }
            None => {
                self.by_key.insert(row.email_key.clone(), self.rows.len());
                self.rows.push(row);
            }
        }
    }
}

fn flush(
    conn: &mut Conn,
    list_id: i64,
    batch: &mut Batch,
    set_status: bool,
) -> Result<UpsertCounts, StoreError> {
    if batch.rows.is_empty() {
        return Ok(UpsertCounts::default());
    }
    batch.by_key.clear();
    let rows = std::mem::take(&mut batch.rows);
    conn.transaction(|conn| {
        let mut total = UpsertCounts::default();
        // Keep each statement well under SQLite's bound-parameter limit.
        for chunk in rows.chunks(1_000) {
            let c = recipients::upsert_batch(conn, list_id, chunk, set_status)?;
            total.inserted += c.inserted;
            total.updated += c.updated;
        }
        Ok(total)
    })
}

/// The attribute templates render as a link (`href`).
const LINK_ATTRIBUTE: &str = "unsubscribe_url";

/// Validate one record into a recipient, or say what is wrong with it.
fn parse_row(
    record: &csv::ByteRecord,
    columns: &[String],
    email_col: usize,
    name_col: Option<usize>,
    status_col: Option<usize>,
) -> Result<NewRecipient, String> {
    if record.as_slice().len() > MAX_RECORD_BYTES {
        return Err(format!("row longer than {MAX_RECORD_BYTES} bytes"));
    }
    if record.len() != columns.len() {
        return Err(format!(
            "has {} fields, the header has {}",
            record.len(),
            columns.len()
        ));
    }
    let field = |i: usize| -> Result<&str, String> {
        std::str::from_utf8(&record[i])
            .map(str::trim)
            .map_err(|_| format!("column {:?} is not valid UTF-8", columns[i]))
    };
    let email = normalise_email(field(email_col)?)?;
    let email_key =
        crate::mailbox::key(&email).map_err(|e| format!("invalid email {email:?}: {e}"))?;
    let name = match name_col {
        Some(i) => field(i)?,
        None => "",
    };
    if name.chars().any(char::is_control) {
        return Err("name contains control characters (CR, LF, …)".into());
    }
    let status = match status_col {
        Some(i) => RecipientStatus::from_input(field(i)?).map_err(|e| e.to_string())?,
        None => RecipientStatus::Active,
    };
    let mut attributes = Map::new();
    for (i, column) in columns.iter().enumerate() {
        if i == email_col || Some(i) == name_col || Some(i) == status_col || column.is_empty() {
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
        attributes.insert(column.clone(), Value::String(value.to_string()));
    }
    Ok(NewRecipient {
        email,
        email_key,
        name: name.to_string(),
        attributes: Value::Object(attributes).to_string(),
        status,
        updated_at: now_ms(),
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
