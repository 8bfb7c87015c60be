//! Reading a CSV file: its header row into columns, each record into a
//! row to import, with the line it started on for reports.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Read;
use std::rc::Rc;

use serde_json::{Map, Value};

use super::sink::Sink;
use super::{
    normalise_email, ImportError, BATCH_ROWS, EMAIL, LINK_ATTRIBUTE, MAX_RECORD_BYTES, NAME, STATUS,
};
use crate::compose;
use crate::store::imports::Row;
use crate::store::recipients::RecipientStatus;

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

pub(super) fn read_csv(
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
    let mut lines = LineCounter {
        newlines,
        lines_before: 0,
    };
    let mut line_at = |byte: u64| lines.line_at(byte);
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

/// The line a record starts on, from the offset where the csv reader
/// began it: skip the line ends (blank lines, the LF of a CRLF) found
/// there, then count the LFs before the first byte of the record. The csv
/// crate's own line numbers skip blank lines and miscount CRLF files.
struct LineCounter {
    /// Line-end bytes and their offsets, as [`LineIndex`] reads them.
    newlines: Rc<RefCell<VecDeque<(u64, u8)>>>,
    lines_before: u64,
}

impl LineCounter {
    fn line_at(&mut self, byte: u64) -> u64 {
        let mut q = self.newlines.borrow_mut();
        let mut at = byte;
        while let Some(&(offset, b)) = q.front() {
            if offset > at {
                break;
            }
            if offset == at {
                at += 1;
            }
            self.lines_before += u64::from(b == b'\n');
            q.pop_front();
        }
        self.lines_before + 1
    }
}

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
    let attributes = attributes_of(columns, &field)?;
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

/// The record's other columns as attributes; an empty one is null.
fn attributes_of<'r>(
    columns: &Columns,
    field: &dyn Fn(usize) -> Result<&'r str, String>,
) -> Result<Map<String, Value>, String> {
    let mut attributes = Map::new();
    for (i, column) in columns.names.iter().enumerate() {
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
    Ok(attributes)
}
