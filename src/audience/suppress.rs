//! `mailsplit suppress add | import | ls | rm`: the global suppression list
//! ([`crate::store::suppressions`]). Entries are addresses (case folded)
//! and whole `@domains` (that exact domain, not its subdomains); the
//! workers apply them at claim time to every campaign and message, so an
//! entry added after `enqueue` still stops the send.
//!
//! `import` streams its file (constant memory): one entry per line, or a
//! CSV whose header has an `email` column; a line that is neither is named
//! by its number and skipped, the rest is added.

use std::io::BufRead;
use std::path::Path;

use crate::store::suppressions::{self, Suppression};
use crate::store::{now_ms, Conn, StoreError};

/// Entries written per transaction by `import`.
const IMPORT_BATCH: usize = 1_000;
/// Bad lines `import` names one by one (the rest are counted).
pub const BAD_LINES_SHOWN: usize = 20;
/// Entries read per page by `ls`.
const PAGE: i64 = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum SuppressError {
    #[error("{0:?} is neither an address nor @domain (e.g. ada@example.com or @example.com)")]
    BadEntry(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the CSV header has no `email` column (columns: {columns}); give a file with one address or @domain per line, or a CSV with an `email` column")]
    NoEmailColumn { path: String, columns: String },
    #[error("{path} line {line}: {why}")]
    Csv {
        path: String,
        line: u64,
        why: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SuppressError {
    pub fn is_usage(&self) -> bool {
        match self {
            SuppressError::BadEntry(_) | SuppressError::NoEmailColumn { .. } => true,
            SuppressError::Read { .. } | SuppressError::Csv { .. } => true,
            SuppressError::Store(e) => e.is_usage(),
        }
    }
}

/// Parse every text as an entry, or name the first that is none.
pub fn parse_entries(texts: &[String]) -> Result<Vec<String>, SuppressError> {
    texts
        .iter()
        .map(|t| suppressions::entry_of(t).ok_or_else(|| SuppressError::BadEntry(t.clone())))
        .collect()
}

/// `suppress add`: how many were new (the rest were there already).
pub fn add(conn: &mut Conn, texts: &[String], reason: &str) -> Result<usize, SuppressError> {
    let entries = parse_entries(texts)?;
    let now = now_ms();
    Ok(conn.transaction(|c| suppressions::add(c, &entries, reason, now))?)
}

/// `suppress rm`: how many were on the list.
pub fn remove(conn: &mut Conn, texts: &[String]) -> Result<usize, SuppressError> {
    let entries = parse_entries(texts)?;
    Ok(conn.transaction(|c| suppressions::remove(c, &entries))?)
}

/// `suppress ls`: hand every entry to `each`, a page at a time.
pub fn list<E: From<SuppressError>>(
    conn: &mut Conn,
    mut each: impl FnMut(&[Suppression]) -> Result<(), E>,
) -> Result<(), E> {
    let mut after: Option<String> = None;
    loop {
        let page = suppressions::page(conn, after.as_deref(), PAGE).map_err(SuppressError::from)?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = Some(last.entry.clone());
        each(&page)?;
        if (page.len() as i64) < PAGE {
            return Ok(());
        }
    }
}

/// One page of the list for the dashboard: up to `limit` entries after
/// `after`, in order.
pub fn page(
    conn: &mut Conn,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<Suppression>, SuppressError> {
    Ok(suppressions::page(conn, after, limit)?)
}

/// What `suppress import` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportCounts {
    /// Lines with an entry.
    pub read: u64,
    /// Entries new to the list.
    pub added: u64,
    /// Entries the list had already (or twice in the file).
    pub already: u64,
    /// Lines that held no entry: their count, and the first
    /// [`BAD_LINES_SHOWN`] as (line number, text).
    pub bad: u64,
    pub bad_lines: Vec<(u64, String)>,
}

impl ImportCounts {
    fn bad_line(&mut self, line: u64, text: &str) {
        self.bad += 1;
        if self.bad_lines.len() < BAD_LINES_SHOWN {
            self.bad_lines
                .push((line, text.chars().take(100).collect()));
        }
    }
}

/// Entries read from a file, written to the list every [`IMPORT_BATCH`].
struct Batches<'a> {
    conn: &'a mut Conn,
    reason: &'a str,
    now: i64,
    batch: Vec<String>,
    counts: ImportCounts,
}

impl Batches<'_> {
    /// Line `line`'s entry `text`, or a bad line.
    fn take(&mut self, line: u64, text: &str) -> Result<(), SuppressError> {
        match suppressions::entry_of(text) {
            Some(entry) => {
                self.counts.read += 1;
                self.batch.push(entry);
            }
            None => self.counts.bad_line(line, text),
        }
        if self.batch.len() >= IMPORT_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    /// A plain line: blank and `#` lines are skipped.
    fn take_plain(&mut self, line: u64, text: &str) -> Result<(), SuppressError> {
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(());
        }
        self.take(line, text)
    }

    fn flush(&mut self) -> Result<(), SuppressError> {
        let (batch, reason, now) = (&self.batch, self.reason, self.now);
        let added = self
            .conn
            .transaction(|c| suppressions::add(c, batch, reason, now))? as u64;
        self.counts.added += added;
        self.counts.already += self.batch.len() as u64 - added;
        self.batch.clear();
        Ok(())
    }
}

/// `suppress import FILE`: one address or `@domain` per line (blank lines
/// and `#` comments skipped), or a CSV whose first line is a header with
/// an `email` column. Streams the file; writes every [`IMPORT_BATCH`].
pub fn import(conn: &mut Conn, path: &Path, reason: &str) -> Result<ImportCounts, SuppressError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| SuppressError::Read {
        path: shown.clone(),
        source,
    })?;
    import_from(conn, std::io::BufReader::new(file), &shown, reason)
}

/// What [`import`] does, from any reader (a file, a pasted form field);
/// `shown` names it in errors.
pub fn import_from(
    conn: &mut Conn,
    mut reader: impl BufRead,
    shown: &str,
    reason: &str,
) -> Result<ImportCounts, SuppressError> {
    let shown = shown.to_string();
    let read_err = |source| SuppressError::Read {
        path: shown.clone(),
        source,
    };
    let mut out = Batches {
        conn,
        reason,
        now: now_ms(),
        batch: Vec::with_capacity(IMPORT_BATCH),
        counts: ImportCounts::default(),
    };
    // The first line says which format: a header naming `email`, or an entry.
    let mut first = String::new();
    reader.read_line(&mut first).map_err(read_err)?;
    let header: Vec<String> = first
        .trim_start_matches('\u{feff}')
        .trim_end()
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_ascii_lowercase())
        .collect();
    if header.len() > 1 || header.first().is_some_and(|h| h == "email") {
        let Some(col) = header.iter().position(|h| h == "email") else {
            return Err(SuppressError::NoEmailColumn {
                path: shown,
                columns: header.join(","),
            });
        };
        read_csv(reader, col, &shown, &mut out)?;
    } else {
        out.take_plain(1, &first)?;
        let mut line_no = 1;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).map_err(read_err)? == 0 {
                break;
            }
            line_no += 1;
            out.take_plain(line_no, &line)?;
        }
    }
    out.flush()?;
    Ok(out.counts)
}

/// The rest of a CSV file after its header: column `col` of each record.
fn read_csv(
    reader: impl std::io::Read,
    col: usize,
    shown: &str,
    out: &mut Batches,
) -> Result<(), SuppressError> {
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(reader);
    let mut record = csv::StringRecord::new();
    loop {
        match csv.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line() + 1);
                if matches!(e.kind(), csv::ErrorKind::Io(_)) {
                    return Err(SuppressError::Csv {
                        path: shown.to_string(),
                        line,
                        why: e.to_string(),
                    });
                }
                out.counts.bad_line(line, "unreadable CSV record");
                continue;
            }
        }
        // Line numbers count the header (line 1).
        let line = record.position().map_or(0, |p| p.line() + 1);
        let text = record.get(col).unwrap_or("").trim();
        if text.is_empty() && record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        out.take(line, text)?;
    }
}
