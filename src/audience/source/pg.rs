//! A `postgres://` source. The read-only transaction begins before
//! anything else is sent; the role is checked next (see
//! [`privileges`]); the query then only ever travels inside a statement
//! of ours sent as one prepared statement, which PostgreSQL refuses to
//! hold two commands (`…; DROP TABLE x` is refused, nothing having run).
//! Its columns come from a row of NULLs (the query under `LIMIT 0`, outer
//! joined), and their types from `pg_typeof`: `numeric` values are read
//! as their text so no digit is lost. Rows stream through a cursor, each
//! as one JSON object built by PostgreSQL (`row_to_json`) so booleans and
//! NULLs keep their types; a row over the cap comes back as its length
//! only, and is never held here.

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sql_types::{Nullable, Text};
use diesel::{Connection, QueryableByName, RunQueryDsl};

use super::{object, quote_ident, RowResult, SourceError};

/// Rows fetched per round trip.
const FETCH_ROWS: usize = 1_000;

pub struct Source {
    conn: PgConnection,
    columns: Vec<String>,
}

#[derive(QueryableByName)]
struct One {
    #[diesel(sql_type = Text)]
    v: String,
}

#[derive(QueryableByName)]
struct Fetched {
    /// The row's JSON, or NULL when it is over the cap.
    #[diesel(sql_type = Nullable<Text>)]
    v: Option<String>,
}

/// The server's own privileges a source must not hold: reading or
/// writing its files, running programs, signalling other sessions.
const SERVER_ROLES: [&str; 4] = [
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
    "pg_signal_backend",
];

/// The names of the columns of `nulls` (the query's columns on one row of
/// NULLs), in order.
fn column_names(conn: &mut PgConnection, nulls: &str) -> diesel::QueryResult<Vec<String>> {
    Ok(diesel::sql_query(format!(
        "SELECT e.key AS v FROM ({nulls}) AS t, \
         json_each(row_to_json(t.*)) WITH ORDINALITY AS e(key, value, n) ORDER BY e.n"
    ))
    .load::<One>(conn)?
    .into_iter()
    .map(|o| o.v)
    .collect())
}

/// The type of each of the `quoted` columns of `nulls`, as PostgreSQL
/// names it (`numeric`, `text`, …).
fn column_types(
    conn: &mut PgConnection,
    nulls: &str,
    quoted: &[String],
) -> Result<Vec<String>, SourceError> {
    let types = diesel::sql_query(format!(
        "SELECT array_to_json(ARRAY[{}]::text[])::text AS v FROM ({nulls}) AS src",
        quoted
            .iter()
            .map(|c| format!("pg_typeof(src.{c})::text"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .get_result::<One>(conn)
    .map_err(|e| SourceError::Query(e.to_string()))?;
    serde_json::from_str(&types.v).map_err(|e| SourceError::Fetch(format!("column types: {e}")))
}

impl Source {
    /// Connect, begin the read-only transaction, check the role (unless
    /// `allow_privileged`) and declare the cursor; nothing is read yet.
    pub fn open(
        url: &str,
        query: &str,
        allow_privileged: bool,
        max_row_bytes: usize,
    ) -> Result<Source, SourceError> {
        let mut conn = PgConnection::establish(url).map_err(|e| SourceError::Connect {
            url: crate::redact::url(url),
            reason: crate::redact::scrub(&e.to_string(), url),
        })?;
        let fetch = |e: diesel::result::Error| SourceError::Fetch(e.to_string());
        conn.batch_execute("BEGIN TRANSACTION READ ONLY")
            .map_err(fetch)?;
        if !allow_privileged {
            let held = privileges(&mut conn).map_err(fetch)?;
            if !held.is_empty() {
                return Err(SourceError::Privileged(held));
            }
        }
        let refused = |e: diesel::result::Error| SourceError::Query(e.to_string());
        // The newlines keep a trailing `--` comment from swallowing the
        // closing parenthesis.
        let nulls = format!(
            "SELECT src.* FROM (SELECT 1) AS mailsplit_one LEFT JOIN \
             (SELECT * FROM (\n{query}\n) AS q LIMIT 0) AS src ON TRUE"
        );
        let columns = column_names(&mut conn, &nulls).map_err(refused)?;
        super::distinct(&columns)?;
        let quoted: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
        let types = column_types(&mut conn, &nulls, &quoted)?;
        let select: Vec<String> = quoted
            .iter()
            .zip(&types)
            .map(|(c, t)| match t.as_str() {
                "numeric" => format!("src.{c}::text AS {c}"),
                _ => format!("src.{c}"),
            })
            .collect();
        diesel::sql_query(format!(
            "DECLARE mailsplit_rows NO SCROLL CURSOR FOR \
             SELECT CASE WHEN octet_length(j) <= {max_row_bytes} THEN j END AS v \
             FROM (SELECT row_to_json(t.*)::text AS j FROM \
             (SELECT {} FROM (\n{query}\n) AS src) AS t) AS r",
            select.join(", ")
        ))
        .execute(&mut conn)
        .map_err(refused)?;
        Ok(Source { conn, columns })
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
        let fetch = |e: diesel::result::Error| SourceError::Fetch(e.to_string());
        loop {
            let page = diesel::sql_query(format!("FETCH {FETCH_ROWS} FROM mailsplit_rows"))
                .load::<Fetched>(&mut self.conn)
                .map_err(fetch)?;
            for row in &page {
                each(match &row.v {
                    Some(json) => object(json),
                    None => Err(super::too_long(max_row_bytes)),
                })?;
            }
            if page.len() < FETCH_ROWS {
                return Ok(());
            }
        }
    }
}

/// What the connected role holds that a source must not, in words (empty
/// when nothing): superuser, one of [`SERVER_ROLES`], or the right to
/// write (or ownership of) a table of this database.
fn privileges(conn: &mut PgConnection) -> diesel::QueryResult<String> {
    let roles: Vec<String> = SERVER_ROLES
        .iter()
        .map(|r| {
            format!("CASE WHEN pg_has_role(current_user, '{r}', 'MEMBER') THEN 'member of {r}' END")
        })
        .collect();
    let sql = format!(
        "SELECT CASE WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) \
           THEN 'superuser' ELSE concat_ws(', ', {}, \
           (SELECT 'owner or writer of table ' || c.oid::regclass::text FROM pg_class c \
              JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') \
                AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%' \
                AND (pg_has_role(c.relowner, 'USAGE') \
                     OR has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')) \
              ORDER BY 1 LIMIT 1)) END AS v",
        roles.join(", ")
    );
    Ok(diesel::sql_query(sql).get_result::<One>(conn)?.v)
}
