//! `import --from-sql QUERY --source URL`: the user's own database as a
//! recipient source: SQLite ([`sqlite`]), PostgreSQL ([`pg`]) or
//! MariaDB/MySQL ([`mysql`]). On every backend the query is compiled as
//! one statement by the driver's single-statement interface (on
//! PostgreSQL and SQLite inside a statement of ours): whatever follows a
//! `;` is refused (exit 2) before anything runs. It then runs read-only (a read-only file or
//! transaction, and on SQLite an authorizer that allows reading only);
//! a role that could do more than read (superuser, server file access,
//! the right to write the tables) is refused unless the user says
//! otherwise. Each row becomes one JSON object with types kept (numbers,
//! booleans, NULLs); NUMERIC/DECIMAL values and integers beyond 2^53 come
//! as their exact text. A row over the size cap, or with a value no
//! attribute can hold (a BLOB, an infinite float), is refused by itself
//! and the import goes on. Rows stream: memory does not grow with the
//! result.

use serde_json::{Map, Number, Value};

mod mysql;
mod pg;
mod sqlite;

/// Why the source refuses one row: the import skips it and reports why.
pub type RowResult = Result<Map<String, Value>, String>;

/// The refusal of anything after the query's first statement.
const ONE_STATEMENT: &str =
    "it holds more than one statement; give one SELECT (nothing after a `;`)";

/// The largest integer a JSON number (an f64 in templates) holds exactly.
const EXACT_INTEGER: u64 = 1 << 53;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Holds the URL redacted.
    #[error("unsupported source URL {0:?}: use postgres://USER@HOST/DB, mysql://USER:PASSWORD@HOST/DB or sqlite://PATH")]
    BadUrl(String),
    /// `url` and `reason` are redacted.
    #[error("cannot open source database {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The query itself is wrong (or writes): the user's to fix.
    #[error("the --from-sql query was refused: {0}")]
    Query(String),
    /// The source's user can do more than read.
    #[error("the source connects as a user who can do more than read ({0}); connect as a read-only user (README: \"A read-only user for --source\"), or pass --allow-privileged-source to accept the risk")]
    Privileged(String),
    #[error("reading the source failed: {0}")]
    Fetch(String),
}

impl SourceError {
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            SourceError::BadUrl(_) | SourceError::Query(_) | SourceError::Privileged(_)
        )
    }
}

/// How a source is opened and read.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Accept a user who can write, read the server's files or is a
    /// superuser.
    pub allow_privileged: bool,
    /// A row whose values take more bytes than this is refused.
    pub max_row_bytes: usize,
}

enum Backend {
    Sqlite(sqlite::Source),
    Pg(pg::Source),
    Mysql(mysql::Source),
}

/// An open source with its query ready to read.
pub struct SqlSource {
    conn: Backend,
    options: Options,
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl SqlSource {
    /// Connect to `url` and prepare `query` (nothing is read yet).
    pub fn open(url: &str, query: &str, options: Options) -> Result<SqlSource, SourceError> {
        let query = query.trim().trim_end_matches(';');
        let conn = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let url = url.replacen("mariadb://", "mysql://", 1);
            Backend::Mysql(mysql::Source::open(&url, query, options)?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Pg(pg::Source::open(
                url,
                query,
                options.allow_privileged,
                options.max_row_bytes,
            )?)
        } else {
            let Some(path) = url.strip_prefix("sqlite:") else {
                return Err(SourceError::BadUrl(crate::redact::url(url)));
            };
            let path = path.strip_prefix("//").unwrap_or(path);
            let shown = crate::redact::url(url);
            if !std::path::Path::new(path).exists() {
                return Err(SourceError::Connect {
                    url: shown,
                    reason: "no such file".into(),
                });
            }
            Backend::Sqlite(sqlite::Source::open(path, &shown, query)?)
        };
        Ok(SqlSource { conn, options })
    }

    /// Column names, in the query's order.
    pub fn columns(&self) -> &[String] {
        match &self.conn {
            Backend::Sqlite(s) => s.columns(),
            Backend::Pg(s) => s.columns(),
            Backend::Mysql(s) => s.columns(),
        }
    }

    /// Hand each row to `each`, in order: a JSON object, or why that row
    /// cannot be imported.
    pub fn rows<E: From<SourceError>>(
        &mut self,
        each: impl FnMut(RowResult) -> Result<(), E>,
    ) -> Result<(), E> {
        let cap = self.options.max_row_bytes;
        match &mut self.conn {
            Backend::Mysql(source) => source.rows(cap, each),
            Backend::Pg(source) => source.rows(cap, each),
            Backend::Sqlite(source) => source.rows(cap, each),
        }
    }
}

/// A row as the source database wrote it in JSON (PostgreSQL), its
/// integers made exact. Not an object (it always is) or a number JSON
/// cannot hold refuses the row alone.
fn object(text: &str) -> RowResult {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(mut map)) => {
            for value in map.values_mut() {
                if let Value::Number(n) = value {
                    if let Some(i) = n.as_i64() {
                        *value = integer(i);
                    } else if let Some(u) = n.as_u64() {
                        *value = unsigned(u);
                    }
                }
            }
            Ok(map)
        }
        Ok(_) => Err("the source did not give the row as an object".into()),
        Err(e) => Err(format!("a value cannot be an attribute: {e}")),
    }
}

/// An integer as a JSON number, or as its text beyond 2^53, where a
/// number would lose digits in a template.
fn integer(i: i64) -> Value {
    if i.unsigned_abs() <= EXACT_INTEGER {
        Value::from(i)
    } else {
        Value::String(i.to_string())
    }
}

fn unsigned(u: u64) -> Value {
    if u <= EXACT_INTEGER {
        Value::from(u)
    } else {
        Value::String(u.to_string())
    }
}

/// A float as a JSON number; NaN or an infinity (JSON has none) refuses
/// the row, naming the column.
fn float(column: &str, f: f64) -> Result<Value, String> {
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| format!("column {column:?} holds {f}, which no attribute can hold"))
}

/// The reason for a row over the cap.
fn too_long(max_row_bytes: usize) -> String {
    format!("row longer than {max_row_bytes} bytes")
}

/// Refuse a query that names a column twice (its values would overwrite
/// each other).
fn distinct(columns: &[String]) -> Result<(), SourceError> {
    let mut seen = std::collections::HashSet::new();
    for c in columns {
        if !seen.insert(c.as_str()) {
            return Err(SourceError::Query(format!(
                "column {c:?} appears twice; give one of them another name (AS …)"
            )));
        }
    }
    Ok(())
}
