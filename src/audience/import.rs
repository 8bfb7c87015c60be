//! `mailsplit import`: stream a CSV file into the recipients table in
//! batched transactions. Rows are validated one by one; a bad row is reported
//! with its line number and skipped, never half-written. Memory is bounded by
//! one batch, however long the file.

use std::path::Path;
use std::str::FromStr;

use crate::audience::source::SourceError;
use crate::store::{Conn, StoreError};

mod csv_file;
mod sink;
mod sql;
mod writers;
use csv_file::read_csv;
use sink::Sink;
pub use sql::import_sql;

/// Rows written per transaction.
pub const BATCH_ROWS: usize = 2_000;
/// Longest accepted CSV record (and SQL source row); longer ones are
/// reported and skipped.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// Reserved columns; every other column becomes a template attribute.
const EMAIL: &str = "email";
const NAME: &str = "name";
const STATUS: &str = "status";
/// The attribute templates render as a link (`href`).
const LINK_ATTRIBUTE: &str = "unsubscribe_url";

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
    /// Rows of addresses erased at their owner's request (`subscriber
    /// forget`): not added. Counted in `skipped` too.
    pub forgotten: u64,
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
