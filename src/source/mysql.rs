//! A `mysql://` source (MariaDB or MySQL), through the pure-Rust `mysql`
//! crate. The query is prepared first: a statement that returns no columns
//! (`DELETE`, `DROP TABLE`, `SELECT … INTO`) is refused before it runs, and
//! the columns are known even when no row comes back. It then runs in
//! `START TRANSACTION READ ONLY`, where a statement that writes and still
//! returns rows (`DELETE … RETURNING`) fails. Rows come over the binary
//! protocol one at a time as the import reads them (the server waits on
//! the socket): memory does not grow with the result. Each value keeps its
//! type from the column's metadata: integers, decimals and floats become
//! numbers, `TINYINT(1)` and `BIT(1)` booleans, `DATE` a full date and
//! `DATETIME`/`TIMESTAMP` RFC 3339 text in UTC (the session's time zone is
//! set to UTC, and a `DATETIME` is taken to be UTC).

use std::time::Duration;

use mysql::consts::{ColumnFlags, ColumnType};
use mysql::prelude::Queryable;
use mysql::{Column, Conn, Opts, OptsBuilder, Statement, Value as My};
use serde_json::{Map, Number, Value};

use super::SourceError;

/// Seconds the server waits for the import to read on (it writes the
/// target between reads).
const NET_WRITE_TIMEOUT_S: u32 = 3_600;
/// The error MariaDB and MySQL give a write in a read-only transaction.
const ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: u16 = 1792;

pub struct Source {
    conn: Conn,
    statement: Statement,
}

impl Source {
    /// Connect and prepare `query`; returns the source and its column names.
    pub fn open(url: &str, query: &str) -> Result<(Source, Vec<String>), SourceError> {
        let connect_err = |e: &dyn std::fmt::Display| SourceError::Connect {
            url: crate::redact::url(url),
            reason: crate::redact::scrub(&e.to_string(), url),
        };
        let opts = Opts::from_url(url).map_err(|e| connect_err(&e))?;
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
        let refused = |e: mysql::Error| SourceError::Query(e.to_string());
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
        Ok((Source { conn, statement }, columns))
    }

    /// Hand each row, as a JSON object, to `each`, in order.
    pub fn rows<E: From<SourceError>>(
        &mut self,
        mut each: impl FnMut(Map<String, Value>) -> Result<(), E>,
    ) -> Result<(), E> {
        // A write the read-only transaction stopped is the query's fault.
        let fetch = |e: mysql::Error| match &e {
            mysql::Error::MySqlError(m) if m.code == ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION => {
                SourceError::Query(e.to_string())
            }
            _ => SourceError::Fetch(e.to_string()),
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
            let mut map = Map::with_capacity(values.len());
            for ((name, kind), value) in columns.iter().zip(values) {
                map.insert(name.clone(), kind.json(value.unwrap_or(My::NULL)));
            }
            each(map)?;
        }
        Ok(())
    }
}

/// How a column's values become JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Boolean,
    Number,
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
            MYSQL_TYPE_TINY
            | MYSQL_TYPE_SHORT
            | MYSQL_TYPE_INT24
            | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG
            | MYSQL_TYPE_YEAR
            | MYSQL_TYPE_FLOAT
            | MYSQL_TYPE_DOUBLE
            | MYSQL_TYPE_DECIMAL
            | MYSQL_TYPE_NEWDECIMAL => Kind::Number,
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
            (_, My::Int(i)) => Value::from(i),
            (_, My::UInt(u)) => Value::from(u),
            (_, My::Float(f)) => number_or_text(f64::from(f)),
            (_, My::Double(f)) => number_or_text(f),
            (Kind::Number, My::Bytes(b)) => {
                let text = String::from_utf8_lossy(&b);
                match text.parse::<Number>() {
                    Ok(n) => Value::Number(n),
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
