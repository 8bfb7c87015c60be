//! A `sqlite://` source, through SQLite's C API (diesel neither refuses
//! a second statement after the first nor lets a connection carry an
//! authorizer). The file is opened read-only; the query is compiled as one
//! statement, wrapped in `SELECT * FROM (…)`, and anything after it is
//! refused before a row is read. An authorizer allows only reading
//! (`SELECT`, table reads, functions other than `load_extension`), and
//! no database may be attached: `ATTACH` would open another file
//! read-write whatever this one's mode, and `VACUUM INTO` writes a copy.
//! Values are read by their storage class: a BLOB, or a REAL that JSON
//! cannot hold (`1e999`), skips its row with a reason; a row's text is
//! measured before it is copied, so an oversized row is never held.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use libsqlite3_sys as ffi;
use serde_json::{Map, Value};

use super::{integer, RowResult, SourceError};

/// The SQLite file and the compiled query.
pub struct Source {
    db: *mut ffi::sqlite3,
    stmt: *mut ffi::sqlite3_stmt,
    columns: Vec<String>,
}

// The connection is opened with SQLITE_OPEN_FULLMUTEX and used by one
// thread at a time (the import's reader): SQLite allows moving it.
unsafe impl Send for Source {}

impl Drop for Source {
    fn drop(&mut self) {
        // SAFETY: both come from SQLite and are released once, here;
        // finalize and close accept null.
        unsafe {
            ffi::sqlite3_finalize(self.stmt);
            ffi::sqlite3_close(self.db);
        }
    }
}

/// Allows what reading needs and denies every other action, at compile
/// time: `ATTACH`, `DETACH`, `VACUUM`, `PRAGMA` and every write.
unsafe extern "C" fn authorize(
    _: *mut c_void,
    action: c_int,
    arg1: *const c_char,
    arg2: *const c_char,
    _: *const c_char,
    _: *const c_char,
) -> c_int {
    let name = |p: *const c_char| {
        // SAFETY: SQLite passes null or a NUL-terminated string.
        (!p.is_null()).then(|| {
            unsafe { CStr::from_ptr(p) }
                .to_string_lossy()
                .to_lowercase()
        })
    };
    match action {
        ffi::SQLITE_SELECT | ffi::SQLITE_READ | ffi::SQLITE_RECURSIVE => ffi::SQLITE_OK,
        // The function's name is the second argument.
        ffi::SQLITE_FUNCTION => match name(arg2).or_else(|| name(arg1)).as_deref() {
            Some("load_extension") => ffi::SQLITE_DENY,
            _ => ffi::SQLITE_OK,
        },
        _ => ffi::SQLITE_DENY,
    }
}

impl Source {
    /// Open `path` read-only and compile `query`; nothing is read yet.
    pub fn open(path: &str, shown: &str, query: &str) -> Result<Source, SourceError> {
        let mut source = Source::open_db(path, shown)?;
        source.prepare(query)?;
        // SAFETY: a compiled statement.
        let count = unsafe { ffi::sqlite3_column_count(source.stmt) };
        source.columns = (0..count)
            .map(|i| {
                // SAFETY: `i` is a column of the statement; the name is
                // copied before the next call.
                let p = unsafe { ffi::sqlite3_column_name(source.stmt, i) };
                if p.is_null() {
                    String::new()
                } else {
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            })
            .collect();
        Ok(source)
    }

    /// The database at `path`, read-only, attaching nothing, under the
    /// authorizer that lets it only read.
    fn open_db(path: &str, shown: &str) -> Result<Source, SourceError> {
        let connect = |reason: String| SourceError::Connect {
            url: shown.to_string(),
            reason,
        };
        let c_path = CString::new(path).map_err(|_| connect("the path holds a NUL byte".into()))?;
        let mut source = Source {
            db: ptr::null_mut(),
            stmt: ptr::null_mut(),
            columns: Vec::new(),
        };
        // SAFETY: a valid C string and out-pointer; the handle is kept in
        // `source`, which closes it (also after a failed open).
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                c_path.as_ptr(),
                &mut source.db,
                ffi::SQLITE_OPEN_READONLY | ffi::SQLITE_OPEN_FULLMUTEX,
                ptr::null(),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(connect(source.message()));
        }
        // SAFETY: an open handle; the authorizer is a plain function
        // that keeps no state.
        unsafe {
            ffi::sqlite3_limit(source.db, ffi::SQLITE_LIMIT_ATTACHED, 0);
            ffi::sqlite3_set_authorizer(source.db, Some(authorize), ptr::null_mut());
        }
        Ok(source)
    }

    /// Compile `query` as the one statement: anything after it is refused.
    fn prepare(&mut self, query: &str) -> Result<(), SourceError> {
        let refused = SourceError::Query;
        // The newlines keep a trailing `--` comment from swallowing the
        // closing parenthesis.
        let wrapped = format!("SELECT * FROM (\n{query}\n) AS src");
        let c_sql = CString::new(wrapped.as_str())
            .map_err(|_| refused("the query holds a NUL byte".into()))?;
        let mut tail: *const c_char = ptr::null();
        // SAFETY: an open handle, a valid C string, out-pointers; the
        // statement is kept in `self`, which finalizes it.
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(self.db, c_sql.as_ptr(), -1, &mut self.stmt, &mut tail)
        };
        if rc != ffi::SQLITE_OK {
            return Err(refused(self.message()));
        }
        if self.stmt.is_null() {
            return Err(refused("it is empty".into()));
        }
        // SAFETY: `tail` points into `c_sql`, which is alive.
        let rest = unsafe { CStr::from_ptr(tail) }.to_string_lossy();
        if !rest.trim().is_empty() {
            return Err(refused(super::ONE_STATEMENT.into()));
        }
        Ok(())
    }

    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// SQLite's message for the connection's last error.
    fn message(&self) -> String {
        if self.db.is_null() {
            return "out of memory".into();
        }
        // SAFETY: an open handle; the message is copied at once.
        unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(self.db)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Hand each row to `each`, in order; a row that cannot be imported
    /// comes as `Err(reason)`.
    pub fn rows<E: From<SourceError>>(
        &mut self,
        max_row_bytes: usize,
        mut each: impl FnMut(RowResult) -> Result<(), E>,
    ) -> Result<(), E> {
        loop {
            // SAFETY: a compiled statement, stepped by this thread only.
            match unsafe { ffi::sqlite3_step(self.stmt) } {
                ffi::SQLITE_ROW => each(self.row(max_row_bytes))?,
                ffi::SQLITE_DONE => return Ok(()),
                _ => return Err(SourceError::Fetch(self.message()).into()),
            }
        }
    }

    /// The current row, its text measured before any is copied.
    fn row(&self, max_row_bytes: usize) -> RowResult {
        let n = self.columns.len() as c_int;
        let mut bytes = 0usize;
        for i in 0..n {
            // SAFETY: `i` is a column of the statement, which holds a row.
            let kind = unsafe { ffi::sqlite3_column_type(self.stmt, i) };
            if kind == ffi::SQLITE_TEXT || kind == ffi::SQLITE_BLOB {
                let len = unsafe { ffi::sqlite3_column_bytes(self.stmt, i) };
                bytes += usize::try_from(len).unwrap_or(0);
            } else {
                bytes += 24;
            }
            bytes += 1;
        }
        if bytes > max_row_bytes {
            return Err(super::too_long(max_row_bytes));
        }
        let mut map = Map::with_capacity(self.columns.len());
        for (i, name) in self.columns.iter().enumerate() {
            let i = i as c_int;
            // SAFETY: as above; text is copied before the next step.
            let value = unsafe {
                match ffi::sqlite3_column_type(self.stmt, i) {
                    ffi::SQLITE_INTEGER => integer(ffi::sqlite3_column_int64(self.stmt, i)),
                    ffi::SQLITE_FLOAT => super::float(name, ffi::sqlite3_column_double(self.stmt, i))?,
                    ffi::SQLITE_TEXT => {
                        let p = ffi::sqlite3_column_text(self.stmt, i);
                        let len = ffi::sqlite3_column_bytes(self.stmt, i);
                        let len = usize::try_from(len).unwrap_or(0);
                        if p.is_null() {
                            Value::String(String::new())
                        } else {
                            let text = std::slice::from_raw_parts(p, len);
                            Value::String(String::from_utf8_lossy(text).into_owned())
                        }
                    }
                    ffi::SQLITE_BLOB => {
                        return Err(format!(
                            "column {name:?} holds a BLOB, which cannot be an attribute; select it as text (e.g. hex({name})) or leave it out"
                        ))
                    }
                    _ => Value::Null,
                }
            };
            map.insert(name.clone(), value);
        }
        Ok(map)
    }
}
