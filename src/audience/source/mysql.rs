//! A `mysql://` source (MariaDB or MySQL), through the pure-Rust `mysql`
//! crate. The query is prepared first: a statement that returns no columns
//! (`DELETE`, `DROP TABLE`, `SELECT … INTO`) is refused before it runs, and
//! the columns are known even when no row comes back; a prepared
//! statement holds one statement only, so nothing after a `;` can run.
//! Before that, a user who can do more than read (global `SUPER` or
//! `FILE`, or the right to write or alter anything) is refused unless the
//! user allows it. The query then runs in `START TRANSACTION READ ONLY`,
//! where a statement that writes and still returns rows (`DELETE …
//! RETURNING`) fails. Rows come over the binary protocol one at a time as
//! the import reads them (the server waits on the socket): memory does not
//! grow with the result, and a row over the cap is dropped as soon as it
//! is measured. Each value keeps its type from the column's metadata:
//! integers and floats become numbers (an integer beyond 2^53 its text),
//! `DECIMAL` its exact text, `TINYINT(1)` and `BIT(1)` booleans, `DATE` a
//! full date and `DATETIME`/`TIMESTAMP` RFC 3339 text in UTC (the
//! session's time zone is set to UTC, and a `DATETIME` is taken to be
//! UTC).

use std::time::Duration;

use mysql::consts::{ColumnFlags, ColumnType};
use mysql::prelude::Queryable;
use mysql::{Column, Conn, Opts, OptsBuilder, Statement, Value as My};
use serde_json::{Map, Number, Value};

use super::{unsigned, Options, RowResult, SourceError};

/// Seconds the server waits for the import to read on (it writes the
/// target between reads).
const NET_WRITE_TIMEOUT_S: u32 = 3_600;
/// The error MariaDB and MySQL give a write in a read-only transaction.
const ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: u16 = 1792;

pub struct Source {
    conn: Conn,
    statement: Statement,
    columns: Vec<String>,
}

/// Privileges a source's user must not hold: the server's files
/// (`LOAD_FILE`), other sessions, and any right to change data or schema.
const REFUSED_PRIVILEGES: &str = "'SUPER', 'FILE', 'PROCESS', 'SHUTDOWN', 'CONNECTION ADMIN', \
     'INSERT', 'UPDATE', 'DELETE', 'DROP', 'CREATE', 'ALTER', 'INDEX', 'CREATE ROUTINE', \
     'ALTER ROUTINE', 'TRIGGER', 'EVENT', 'CREATE VIEW', 'LOCK TABLES', 'GRANT OPTION'";

impl Source {
    /// Connect, check the user (unless allowed) and prepare `query`.
    pub fn open(url: &str, query: &str, options: Options) -> Result<Source, SourceError> {
        let connect_err = |e: &mysql::Error| SourceError::Connect {
            url: crate::redact::url(url),
            reason: crate::redact::scrub(&describe(e), url),
        };
        let opts = Opts::from_url(url).map_err(|e| connect_err(&e.into()))?;
        let opts = OptsBuilder::from_opts(opts)
            // Connect where the URL says, not to the socket the server names.
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(10)))
            .init(vec![
                "SET NAMES utf8mb4".to_string(),
                "SET time_zone = '+00:00'".to_string(),
                format!("SET SESSION net_write_timeout = {NET_WRITE_TIMEOUT_S}"),
            ]);
        let mut conn = Conn::new(opts).map_err(|e| connect_err(&e))?;
        if !options.allow_privileged {
            let held = privileges(&mut conn).map_err(|e| SourceError::Fetch(describe(&e)))?;
            if !held.is_empty() {
                return Err(SourceError::Privileged(held));
            }
        }
        let refused = |e: mysql::Error| SourceError::Query(describe(&e));
        let statement = conn.prep(query).map_err(refused)?;
        if statement.num_columns() == 0 {
            return Err(SourceError::Query(
                "it returns no rows (only a SELECT, or another statement that returns rows, can be a source)".into(),
            ));
        }
        let columns = statement
            .columns()
            .iter()
            .map(|c| c.name_str().into_owned())
            .collect();
        Ok(Source {
            conn,
            statement,
            columns,
        })
    }

    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Hand each row to `each`, in order; a row that cannot be imported
    /// comes as `Err(reason)`.
    pub fn rows<E: From<SourceError>>(
        &mut self,
        max_row_bytes: usize,
        mut each: impl FnMut(RowResult) -> Result<(), E>,
    ) -> Result<(), E> {
        // A write the read-only transaction stopped is the query's fault.
        let fetch = |e: mysql::Error| match &e {
            mysql::Error::MySqlError(m) if m.code == ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION => {
                SourceError::Query(describe(&e))
            }
            _ => SourceError::Fetch(describe(&e)),
        };
        self.conn
            .query_drop("START TRANSACTION READ ONLY")
            .map_err(fetch)?;
        let columns: Vec<(String, Kind)> = self
            .statement
            .columns()
            .iter()
            .map(|c| (c.name_str().into_owned(), Kind::of(c)))
            .collect();
        let result = self.conn.exec_iter(&self.statement, ()).map_err(fetch)?;
        for row in result {
            // `unwrap_raw` cannot panic (`unwrap` does on a taken value).
            let values = row.map_err(fetch)?.unwrap_raw();
            if bytes(&values) > max_row_bytes {
                drop(values);
                each(Err(super::too_long(max_row_bytes)))?;
                continue;
            }
            let mut map = Map::with_capacity(values.len());
            for ((name, kind), value) in columns.iter().zip(values) {
                map.insert(name.clone(), kind.json(value.unwrap_or(My::NULL)));
            }
            each(Ok(map))?;
        }
        Ok(())
    }
}

/// A row's size as the CSV import counts it: its values' bytes and one
/// separator each.
fn bytes(values: &[Option<My>]) -> usize {
    values
        .iter()
        .map(|v| match v {
            Some(My::Bytes(b)) => b.len() + 1,
            _ => 24,
        })
        .sum()
}

/// What the connected user holds of [`REFUSED_PRIVILEGES`], globally, on
/// a database or a table (empty when nothing).
/// The driver's error in words a user acts on: the server's own message
/// (not the driver's `MySqlError { … }` wrapping), and for a URL that does
/// not parse, the usual cause.
fn describe(e: &mysql::Error) -> String {
    match e {
        mysql::Error::MySqlError(m) => format!(
            "{} (MySQL error {}, SQLSTATE {})",
            m.message, m.code, m.state
        ),
        mysql::Error::UrlError(mysql::UrlError::ParseError(p)) => format!(
            "the URL does not parse ({p}): percent-encode the user name and password \
             (`/` as %2F, `@` as %40, `:` as %3A, `#` as %23, `%` as %25)"
        ),
        mysql::Error::UrlError(u) => u.to_string(),
        mysql::Error::IoError(io) => io.to_string(),
        mysql::Error::DriverError(d) => d.to_string(),
        other => other.to_string(),
    }
}

fn privileges(conn: &mut Conn) -> Result<String, mysql::Error> {
    let sql = format!(
        "SELECT COALESCE(GROUP_CONCAT(DISTINCT PRIVILEGE_TYPE ORDER BY PRIVILEGE_TYPE SEPARATOR ', '), '') \
         FROM (SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES \
               UNION ALL SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES \
               UNION ALL SELECT GRANTEE, PRIVILEGE_TYPE FROM information_schema.TABLE_PRIVILEGES) AS p \
         WHERE GRANTEE = CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
                                SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''') \
           AND PRIVILEGE_TYPE IN ({REFUSED_PRIVILEGES})"
    );
    let held: Option<String> = conn.query_first(sql)?;
    Ok(held
        .filter(|h| !h.is_empty())
        .map_or_else(String::new, |h| format!("privileges {h}")))
}

/// How a column's values become JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Boolean,
    Number,
    /// `DECIMAL`: its exact text.
    Decimal,
    Json,
    Date,
    DateTime,
    Text,
}

impl Kind {
    fn of(column: &Column) -> Kind {
        use ColumnType::*;
        let one = column.column_length() == 1;
        match column.column_type() {
            MYSQL_TYPE_TINY if one => Kind::Boolean,
            MYSQL_TYPE_BIT if one => Kind::Boolean,
            MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG | MYSQL_TYPE_YEAR | MYSQL_TYPE_FLOAT | MYSQL_TYPE_DOUBLE => {
                Kind::Number
            }
            MYSQL_TYPE_DECIMAL | MYSQL_TYPE_NEWDECIMAL => Kind::Decimal,
            MYSQL_TYPE_JSON => Kind::Json,
            MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => Kind::Date,
            MYSQL_TYPE_DATETIME
            | MYSQL_TYPE_DATETIME2
            | MYSQL_TYPE_TIMESTAMP
            | MYSQL_TYPE_TIMESTAMP2 => Kind::DateTime,
            _ if column.flags().contains(ColumnFlags::NUM_FLAG) => Kind::Number,
            _ => Kind::Text,
        }
    }

    /// One value as JSON; NULL (and MySQL's zero date) as `Null`.
    fn json(self, value: My) -> Value {
        match (self, value) {
            (_, My::NULL) => Value::Null,
            (Kind::Boolean, My::Int(i)) => Value::Bool(i != 0),
            (Kind::Boolean, My::UInt(u)) => Value::Bool(u != 0),
            (Kind::Boolean, My::Bytes(b)) => Value::Bool(b.iter().any(|&x| x != 0)),
            (_, My::Int(i)) => super::integer(i),
            (_, My::UInt(u)) => unsigned(u),
            (_, My::Float(f)) => number_or_text(f64::from(f)),
            (_, My::Double(f)) => number_or_text(f),
            (Kind::Number, My::Bytes(b)) => {
                let text = String::from_utf8_lossy(&b);
                match text.parse::<Number>() {
                    Ok(n) => match (n.as_i64(), n.as_u64()) {
                        (Some(i), _) => super::integer(i),
                        (_, Some(u)) => unsigned(u),
                        _ => Value::Number(n),
                    },
                    Err(_) => Value::String(text.into_owned()),
                }
            }
            (Kind::Json, My::Bytes(b)) => serde_json::from_slice(&b)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned())),
            (_, My::Bytes(b)) => Value::String(String::from_utf8_lossy(&b).into_owned()),
            (_, My::Date(0, 0, 0, ..)) => Value::Null,
            (Kind::Date, My::Date(y, m, d, ..)) => Value::String(format!("{y:04}-{m:02}-{d:02}")),
            (_, My::Date(y, m, d, h, mi, s, us)) => {
                let fraction = if us == 0 {
                    String::new()
                } else {
                    format!(".{us:06}")
                };
                Value::String(format!(
                    "{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}{fraction}Z"
                ))
            }
            (_, My::Time(negative, days, h, m, s, us)) => {
                let sign = if negative { "-" } else { "" };
                let hours = days * 24 + u32::from(h);
                let fraction = if us == 0 {
                    String::new()
                } else {
                    format!(".{us:06}")
                };
                Value::String(format!("{sign}{hours:02}:{m:02}:{s:02}{fraction}"))
            }
        }
    }
}

/// A float as a JSON number; NaN and infinities (JSON has none) as text.
fn number_or_text(f: f64) -> Value {
    Number::from_f64(f).map_or_else(|| Value::String(f.to_string()), Value::Number)
}
