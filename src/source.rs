//! `import --from-sql QUERY --source URL`: the user's own database as a
//! recipient source (SQLite, PostgreSQL, or MariaDB/MySQL in
//! [`mysql`]). On SQLite and PostgreSQL the query becomes a temporary
//! view (so a statement that writes is refused before anything runs, and
//! the columns are known even when no row comes back), then runs in a
//! read-only transaction; each row comes back as one JSON object built by
//! the source database itself (`row_to_json`, `json_object`), so numbers,
//! booleans and NULLs keep their types. Rows stream in pages (a cursor on
//! PostgreSQL, a stepped statement on SQLite): memory does not grow with
//! the result.

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sql_types::Text;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryableByName, RunQueryDsl};
use serde_json::{Map, Value};

mod mysql;

/// Rows fetched per round trip from PostgreSQL.
const FETCH_ROWS: usize = 1_000;
/// The temporary view holding the user's query.
const VIEW: &str = "mailsplit_source";

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
    #[error("reading the source failed: {0}")]
    Fetch(String),
}

impl SourceError {
    pub fn is_usage(&self) -> bool {
        matches!(self, SourceError::BadUrl(_) | SourceError::Query(_))
    }
}

enum Backend {
    Sqlite(SqliteConnection),
    Pg(PgConnection),
    Mysql(mysql::Source),
}

/// An open source with its query ready to read.
pub struct SqlSource {
    conn: Backend,
    /// Column names, in the query's order.
    pub columns: Vec<String>,
}

#[derive(QueryableByName)]
struct One {
    #[diesel(sql_type = Text)]
    v: String,
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_text(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl SqlSource {
    /// Connect to `url` and prepare `query` (nothing is read yet).
    pub fn open(url: &str, query: &str) -> Result<SqlSource, SourceError> {
        let connect_err = |e: diesel::ConnectionError| SourceError::Connect {
            url: crate::redact::url(url),
            reason: crate::redact::scrub(&e.to_string(), url),
        };
        let refused = |e: diesel::result::Error| SourceError::Query(e.to_string());
        let query = query.trim().trim_end_matches(';');
        if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let url = url.replacen("mariadb://", "mysql://", 1);
            let (source, columns) = mysql::Source::open(&url, query)?;
            return Ok(SqlSource {
                conn: Backend::Mysql(source),
                columns,
            });
        }
        let create = format!("CREATE TEMP VIEW {VIEW} AS {query}");
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut c = PgConnection::establish(url).map_err(connect_err)?;
            c.batch_execute(&create).map_err(refused)?;
            let columns = diesel::sql_query(format!(
                "SELECT attname::text AS v FROM pg_attribute \
                 WHERE attrelid = 'pg_temp.{VIEW}'::regclass AND attnum > 0 \
                 AND NOT attisdropped ORDER BY attnum"
            ))
            .load::<One>(&mut c)
            .map_err(refused)?;
            let columns = columns.into_iter().map(|o| o.v).collect();
            // Everything from here on can only read.
            c.batch_execute(&format!(
                "BEGIN TRANSACTION READ ONLY; \
                 DECLARE mailsplit_rows NO SCROLL CURSOR FOR \
                 SELECT row_to_json(s)::text AS v FROM pg_temp.{VIEW} s"
            ))
            .map_err(refused)?;
            return Ok(SqlSource {
                conn: Backend::Pg(c),
                columns,
            });
        }
        let Some(path) = url.strip_prefix("sqlite:") else {
            return Err(SourceError::BadUrl(crate::redact::url(url)));
        };
        let path = path.strip_prefix("//").unwrap_or(path);
        if !std::path::Path::new(path).exists() {
            return Err(SourceError::Connect {
                url: crate::redact::url(url),
                reason: "no such file".into(),
            });
        }
        let escaped = path
            .replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23");
        let mut c =
            SqliteConnection::establish(&format!("file:{escaped}?mode=ro")).map_err(connect_err)?;
        c.batch_execute(&create).map_err(refused)?;
        let columns: Vec<String> = diesel::sql_query(format!(
            "SELECT name AS v FROM pragma_table_info('{VIEW}', 'temp')"
        ))
        .load::<One>(&mut c)
        .map_err(refused)?
        .into_iter()
        .map(|o| o.v)
        .collect();
        c.batch_execute("PRAGMA query_only = 1; BEGIN")
            .map_err(refused)?;
        Ok(SqlSource {
            conn: Backend::Sqlite(c),
            columns,
        })
    }

    /// Hand each row, as a JSON object, to `each`, in order.
    pub fn rows<E: From<SourceError>>(
        &mut self,
        mut each: impl FnMut(Map<String, Value>) -> Result<(), E>,
    ) -> Result<(), E> {
        let fetch = |e: diesel::result::Error| SourceError::Fetch(e.to_string());
        match &mut self.conn {
            Backend::Mysql(source) => source.rows(each),
            Backend::Pg(c) => loop {
                let page = diesel::sql_query(format!("FETCH {FETCH_ROWS} FROM mailsplit_rows"))
                    .load::<One>(c)
                    .map_err(fetch)?;
                for row in &page {
                    each(object(&row.v)?)?;
                }
                if page.len() < FETCH_ROWS {
                    return Ok(());
                }
            },
            Backend::Sqlite(c) => {
                let pairs: Vec<String> = self
                    .columns
                    .iter()
                    .map(|n| format!("{}, {}", quote_text(n), quote_ident(n)))
                    .collect();
                let sql = format!(
                    "SELECT json_object({}) AS v FROM temp.{VIEW}",
                    pairs.join(", ")
                );
                let rows = diesel::sql_query(sql)
                    .load_iter::<One, diesel::connection::DefaultLoadingMode>(c)
                    .map_err(fetch)?;
                for row in rows {
                    each(object(&row.map_err(fetch)?.v)?)?;
                }
                Ok(())
            }
        }
    }
}

/// A row as the source database wrote it in JSON.
fn object(text: &str) -> Result<Map<String, Value>, SourceError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(SourceError::Fetch(format!("not a JSON object: {text}"))),
    }
}
