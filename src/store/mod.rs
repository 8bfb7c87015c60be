//! The database: one connection type for SQLite and PostgreSQL, the embedded
//! migrations, and the store functions every stage uses.
//!
//! Each store function takes `&mut Conn` so several compose inside one
//! [`Conn::transaction`]. Queries are written once with diesel's DSL and
//! compiled for both backends by the `on!` macro, which matches on the
//! connection and runs the same expression against the concrete type.
//! Conditional writes report affected-row counts, and the counters are moved
//! by exactly those counts in the same transaction, so they always equal a
//! `COUNT(*)` over the ledger.

mod error;
pub use error::{Result, StoreError};
#[macro_use]
mod text_enum;
mod url;
pub use url::{backend_of, exposed_sqlite_file, Access, Backend, DbFile};
use url::{sqlite_path, sqlite_target, with_link_checks};
pub mod ab;
pub mod api_keys;
pub mod archive;
pub mod autopause;
pub mod bounces;
pub mod campaigns;
pub mod connections;
pub mod content;
pub mod database;
pub mod db;
pub mod deliveries;
pub mod dkim_keys;
pub mod drafts;
pub mod engagement;
pub mod erase;
pub mod flow_report;
pub mod flow_sql;
pub mod flows;
pub mod forgotten;
pub mod import_lock;
pub mod imports;
pub mod installation;
pub mod lists;
pub mod message_engagement;
pub mod message_templates;
pub mod messages;
pub mod messages_sweep;
pub mod optouts;
pub mod outbox;
pub mod people;
pub mod person;
mod plans;
pub mod preferences;
mod prepared;
pub mod rates;
pub mod recipients;
pub mod report;
pub mod schema;
pub mod sessions;
pub mod signups;
pub mod subscribers;
pub mod suppressions;
pub mod template_links;
pub mod timeline;
pub mod unverified;
mod versions;
pub mod views;
pub mod warmups;
pub mod webhooks;
pub mod workers;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sqlite::SqliteConnection;
use diesel::Connection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

pub use campaigns::{Campaign, CampaignState, Counters};
pub use db::{Db, Plans};
pub use deliveries::{Claim, DeliveryState, Outcome, OutcomeKind};
pub use installation::Installation;
pub use recipients::{Recipient, RecipientStatus};

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// How long a SQLite connection waits for another process's write lock before
/// giving up. Long on purpose: several workers share one file, and a worker
/// should wait out a slow writer rather than drop an outcome.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to either backend, and how deep in nested transactions it is.
pub struct Conn {
    inner: Inner,
    depth: u32,
    plans: plans::PlanMode,
    /// Who wants which webhook event (see [`outbox::subscribers`]).
    subscribers: outbox::Subscribers,
    /// What opened it, for [`Conn::another`]; never shown (it may hold a
    /// password).
    url: std::sync::Arc<str>,
}

enum Inner {
    Sqlite(SqliteConnection),
    Pg(PgConnection),
}

/// Run one expression against whichever concrete connection `$conn` holds.
/// The expression is compiled once per backend, so diesel checks it for both.
macro_rules! on {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn.inner_mut() {
            $crate::store::InnerMut::Sqlite($c) => $body,
            $crate::store::InnerMut::Pg($c) => $body,
        }
    };
}

/// The concrete connection, borrowed for one `on!` body.
pub(crate) enum InnerMut<'a> {
    Sqlite(&'a mut SqliteConnection),
    Pg(&'a mut PgConnection),
}
pub(crate) use on;

impl Conn {
    /// Open a connection, creating a missing SQLite file (what `migrate`
    /// does; see [`Conn::open_with`]).
    pub fn open(url: &str) -> Result<Conn> {
        Conn::open_with(url, Access::Create)
    }

    /// Open a connection for `access`. SQLite gets WAL mode, a busy timeout
    /// and `synchronous=NORMAL` (durable at each checkpoint, safe against a
    /// crash of the process) so several worker processes can share the file.
    pub fn open_with(url: &str, access: Access) -> Result<Conn> {
        let connect_err = |e: diesel::ConnectionError| StoreError::Connect {
            url: crate::redact::url(url),
            reason: crate::redact::scrub(&e.to_string(), url),
        };
        let inner = match backend_of(url)? {
            Backend::Sqlite => {
                let target = sqlite_target(sqlite_path(url), access)?;
                let mut c = SqliteConnection::establish(&target).map_err(connect_err)?;
                c.batch_execute(&format!(
                    "PRAGMA busy_timeout = {};",
                    SQLITE_BUSY_TIMEOUT.as_millis()
                ))?;
                if access != Access::ReadOnly {
                    // secure_delete: what a write frees (an old version of
                    // a row, a deleted row, a freed page) is overwritten
                    // with zeros, so erased people leave no copy in free
                    // space (`subscriber forget`; cost in BENCHMARKS.md).
                    c.batch_execute(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                         PRAGMA secure_delete = ON;",
                    )?;
                }
                Inner::Sqlite(c)
            }
            Backend::Postgres => {
                let mut c = PgConnection::establish(&with_link_checks(url)).map_err(connect_err)?;
                // The ledger grows from empty during a campaign. A generic
                // plan cached while it was small (a sequential scan) would
                // stay in use as it grows to millions of rows, all the more
                // where autovacuum is off; plan each statement for its data
                // (a worker's connection switches once the ledger is large:
                // see `plans`).
                c.batch_execute(plans::CUSTOM_PLANS)?;
                if access == Access::ReadOnly {
                    c.batch_execute("SET default_transaction_read_only = on")?;
                }
                Inner::Pg(c)
            }
        };
        let mut conn = Conn {
            inner,
            depth: 0,
            plans: plans::PlanMode::default(),
            subscribers: outbox::Subscribers::default(),
            url: url.into(),
        };
        conn.refuse_newer_schema()?;
        Ok(conn)
    }

    /// Have PostgreSQL end this session's transactions left idle for
    /// `after`, and their locks with them: for a session whose statements
    /// of a transaction follow each other at once (see [`db`]), such a
    /// transaction belongs to a client the server no longer hears.
    /// SQLite: nothing to do.
    pub fn end_idle_transactions_after(&mut self, after: Duration) -> Result<()> {
        match self.backend() {
            Backend::Postgres => self.execute_batch(&format!(
                "SET idle_in_transaction_session_timeout = {}",
                after.as_millis()
            )),
            Backend::Sqlite => Ok(()),
        }
    }

    /// A second connection to the same database, for work split across
    /// connections (an import's writers).
    pub fn another(&self) -> Result<Conn> {
        Conn::open_with(&self.url, Access::ReadWrite)
    }

    pub(crate) fn inner_mut(&mut self) -> InnerMut<'_> {
        match &mut self.inner {
            Inner::Sqlite(c) => InnerMut::Sqlite(c),
            Inner::Pg(c) => InnerMut::Pg(c),
        }
    }

    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Pg(_) => Backend::Postgres,
        }
    }

    /// Commits of this session return before PostgreSQL flushes them to
    /// disk (`synchronous_commit = off`): the durability SQLite has with
    /// `synchronous = NORMAL`. A commit is visible at once and survives a
    /// crash of this process; only a crash of the database server itself can
    /// roll back its last fraction of a second. For work whose every step is
    /// idempotent against the ledger (enqueue), that trade is one fsync less
    /// per step. SQLite: nothing to change.
    pub fn defer_commit_flush(&mut self) -> Result<()> {
        match self.backend() {
            Backend::Postgres => self.execute_batch("SET synchronous_commit = off"),
            Backend::Sqlite => Ok(()),
        }
    }

    /// Run `sql` (several statements; nothing but trusted values formatted
    /// in) as one transaction in one round trip: BEGIN and COMMIT travel
    /// with it. Inside a caller's transaction it simply joins that one.
    pub fn execute_atomic(&mut self, sql: &str) -> Result<()> {
        if self.depth > 0 {
            return self.execute_batch(sql);
        }
        let result = self.execute_batch(&format!("{}; {sql}; COMMIT", self.begin_statement()));
        if result.is_err() {
            // Whatever part ran is undone (a no-op if BEGIN itself failed).
            let _ = self.execute_batch("ROLLBACK");
        }
        result
    }

    /// How a top-level transaction starts: SQLite takes the write lock up
    /// front (see [`Conn::transaction`]).
    fn begin_statement(&self) -> &'static str {
        match self.backend() {
            Backend::Sqlite => "BEGIN IMMEDIATE",
            Backend::Postgres => "BEGIN",
        }
    }

    /// Refresh the planner's statistics of `tables` after a bulk change.
    /// PostgreSQL's autovacuum would do it eventually (and on some servers it
    /// is off); until then it plans for the tables' old sizes, and enqueue's
    /// keyset page joined every remaining row before sorting, a cost that
    /// grows with the list. The VACUUM marks the new pages all-visible, so
    /// that the page's index-only scan of `list_members` reads no table
    /// rows (figures in BENCHMARKS.md, "Measurements behind the code's
    /// choices"). It takes no lock that stops readers or writers. SQLite plans these queries by their keys alone.
    pub fn refresh_statistics(&mut self, tables: &[&str]) -> Result<()> {
        match self.backend() {
            Backend::Postgres => {
                self.execute_batch(&format!("VACUUM (ANALYZE) {}", tables.join(", ")))
            }
            Backend::Sqlite => Ok(()),
        }
    }

    /// Apply pending migrations, give the database its identity (see
    /// [`installation`]) if it has none and every recipient its mailbox key
    /// (see [`recipients::backfill_keys`]); returns the names of the
    /// migrations applied.
    pub fn migrate(&mut self) -> Result<Vec<String>> {
        let applied = on!(self, |c| {
            c.run_pending_migrations(migrations_of(c.backend_name()))
                .map(|v| v.iter().map(|m| m.to_string()).collect::<Vec<_>>())
                .map_err(|e| StoreError::Migrate(e.to_string()))
        })?;
        installation::ensure(self)?;
        let twins = recipients::backfill_keys(self)?;
        if twins > 0 {
            tracing::warn!(
                twins,
                "recipients imported earlier under another spelling of a mailbox already on file are no longer mailed (status_reason says which)"
            );
        }
        Ok(applied)
    }

    /// Run `f` in one transaction; nested calls become savepoints, so store
    /// functions compose inside a caller's transaction. SQLite takes the
    /// write lock up front (`BEGIN IMMEDIATE`) so two writers never deadlock
    /// upgrading a read lock; the busy timeout then queues them.
    pub fn transaction<T, E>(&mut self, f: impl FnOnce(&mut Conn) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let depth = self.depth;
        let (begin, commit, rollback) = match depth {
            0 => (
                self.begin_statement().to_string(),
                "COMMIT".to_string(),
                "ROLLBACK".to_string(),
            ),
            d => (
                format!("SAVEPOINT sp{d}"),
                format!("RELEASE SAVEPOINT sp{d}"),
                format!("ROLLBACK TO SAVEPOINT sp{d}; RELEASE SAVEPOINT sp{d}"),
            ),
        };
        self.execute_batch(&begin).map_err(E::from)?;
        self.depth += 1;
        let result = f(self);
        self.depth = depth;
        match result {
            Ok(v) => {
                if let Err(e) = self.execute_batch(&commit) {
                    let _ = self.execute_batch(&rollback);
                    return Err(E::from(e));
                }
                Ok(v)
            }
            Err(e) => {
                let _ = self.execute_batch(&rollback);
                Err(e)
            }
        }
    }

    /// Run `f`, which only reads, in one read transaction on SQLite: one
    /// set of file locks and one look at the write-ahead log for all its
    /// statements, instead of one per statement (a transactional message's
    /// checks are several small reads). On PostgreSQL, and inside a
    /// transaction, `f` runs as it is: a BEGIN and a COMMIT there would be
    /// two more round trips.
    pub fn reads<T, E>(&mut self, f: impl FnOnce(&mut Conn) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        if self.depth > 0 || self.backend() == Backend::Postgres {
            return f(self);
        }
        self.execute_batch("BEGIN").map_err(E::from)?;
        self.depth += 1;
        let result = f(self);
        self.depth -= 1;
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        match (result, self.execute_batch(end)) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => {
                let _ = self.execute_batch("ROLLBACK");
                Err(E::from(e))
            }
            (Err(e), _) => Err(e),
        }
    }

    pub fn execute_batch(&mut self, sql: &str) -> Result<()> {
        on!(self, |c| c.batch_execute(sql))?;
        Ok(())
    }
}

/// The embedded migrations of a backend. Both directories hold the same
/// versions, one flavour each.
fn migrations_of(backend: Backend) -> EmbeddedMigrations {
    match backend {
        Backend::Sqlite => SQLITE_MIGRATIONS,
        Backend::Postgres => PG_MIGRATIONS,
    }
}

/// Open an existing database and check that the schema is current (the
/// fix named when it is not): what every command but `migrate` starts with.
pub fn open_migrated(url: &str) -> Result<Conn> {
    let mut conn = Conn::open_with(url, Access::ReadWrite)?;
    conn.check_migrated()?;
    Ok(conn)
}

/// [`open_migrated`] for commands that only read: nothing they do can
/// write, and a missing SQLite file is named, never created.
pub fn open_read_only(url: &str) -> Result<Conn> {
    let mut conn = Conn::open_with(url, Access::ReadOnly)?;
    conn.check_migrated()?;
    Ok(conn)
}

/// Which backend a concrete diesel connection is; lets `on!` bodies pick
/// backend-specific constants.
trait BackendName {
    fn backend_name(&self) -> Backend;
}
impl BackendName for SqliteConnection {
    fn backend_name(&self) -> Backend {
        Backend::Sqlite
    }
}
impl BackendName for PgConnection {
    fn backend_name(&self) -> Backend {
        Backend::Postgres
    }
}

/// Milliseconds since the Unix epoch: the one timestamp format in the schema.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `text` as one line of at most `max` characters (control characters
/// become spaces): for reasons stored from what others wrote (a relay's
/// reply, a bounce report).
pub fn clip_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_checks_are_added_unless_the_url_sets_them() {
        let plain = with_link_checks("postgres://u@h/db");
        assert!(plain.starts_with("postgres://u@h/db?connect_timeout=10&keepalives=1&"));
        assert!(plain.ends_with("&tcp_user_timeout=30000"), "{plain}");
        let own = with_link_checks("postgres://u@h/db?sslmode=require&connect_timeout=3");
        assert!(own.starts_with("postgres://u@h/db?sslmode=require&connect_timeout=3&keepalives=1"));
        assert_eq!(own.matches("connect_timeout").count(), 1, "{own}");
    }
}
