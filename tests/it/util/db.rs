//! A fresh SQLite file or PostgreSQL database per test.
//!
//! [`TestDb::new`] gives a database whose schema is already migrated but
//! which has no identity yet: a copy of a template that `mailsplit migrate`
//! made once for the whole suite (per migrations set), with its
//! `installation` row deleted. The test's own first `migrate` then has
//! nothing to apply but gives the database an identity of its own, as on
//! a fresh install. Why: on PostgreSQL the migrations cost 0.8 s and
//! 0.2 s of the server's CPU per database, for some 400 databases a run;
//! a copy from a template costs what the empty `CREATE DATABASE` did.
//! [`TestDb::empty`] is the truly empty database, for the tests of
//! `migrate` itself and of what commands say before it.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use super::BIN;

/// Base URL of the PostgreSQL server the tests create databases on.
pub fn pg_base() -> String {
    std::env::var("MAILSPLIT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432".into())
}

static DB_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh, empty database, dropped with the value.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

impl TestDb {
    /// A database with the schema migrated and no identity (see the
    /// module's comment): what a test wants unless it tests `migrate`.
    pub fn new(kind: Kind) -> TestDb {
        TestDb::create(kind, true)
    }
    /// A database with nothing in it, not even the migrations' table.
    pub fn empty(kind: Kind) -> TestDb {
        TestDb::create(kind, false)
    }
    fn create(kind: Kind, migrated: bool) -> TestDb {
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("test.db");
                if migrated {
                    std::fs::copy(sqlite_template(), &file).unwrap();
                }
                TestDb {
                    url: format!("sqlite://{}", file.display()),
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
            Kind::Postgres => {
                let name = format!(
                    "mailsplit_t{}_{}_{}",
                    std::process::id(),
                    DB_SEQ.fetch_add(1, Ordering::SeqCst),
                    Instant::now().elapsed().subsec_nanos()
                );
                match migrated {
                    true => psql(&format!(
                        "CREATE DATABASE {name} TEMPLATE {}",
                        pg_template()
                    )),
                    false => psql(&format!("CREATE DATABASE {name}")),
                }
                TestDb {
                    url: format!("{}/{name}", pg_base()),
                    pg_name: Some(name),
                    _dir: None,
                }
            }
        }
    }
    pub fn kind(&self) -> Kind {
        if self.pg_name.is_some() {
            Kind::Postgres
        } else {
            Kind::Sqlite
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            if !drop_in_background(&sql) {
                psql(&sql);
            }
        }
    }
}

/// Run `sql` through a `psql` the test does not wait for, if there is one.
/// Why: PostgreSQL's DROP DATABASE forces a checkpoint and waits for it,
/// 0.5 s on a quiet server and 4-5 s beside the rest of the suite: time a
/// test would spend on nothing but its own teardown. The database is no
/// one else's, so nothing waits for it to go. In a process group of its
/// own: nextest ends the test's group when the test returns.
fn drop_in_background(sql: &str) -> bool {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("psql")
        .args([&format!("{}/test", pg_base()), "-q", "-c", sql])
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok()
}

/// A short hash of the migrations of `flavour` (their names and texts): a
/// template is made again when they change.
fn migrations_hash(flavour: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(flavour);
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for path in names {
        path.file_name().hash(&mut h);
        std::fs::read(path.join("up.sql"))
            .unwrap_or_default()
            .hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

/// `mailsplit migrate` on `url`, then the identity removed.
fn migrate_without_identity(url: &str) {
    let out = std::process::Command::new(BIN)
        .arg("migrate")
        .env("DATABASE_URL", url)
        .env("MAILSPLIT_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "migrate of the test template {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut conn = mailsplit::store::Conn::open(url).unwrap();
    conn.execute_batch("DELETE FROM installation").unwrap();
}

/// The migrated SQLite file every SQLite [`TestDb`] starts as a copy of,
/// made by the first test that needs it (a rename makes it whole at once:
/// two tests making it together each rename a complete file).
fn sqlite_template() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(format!("template-{}.sqlite", migrations_hash("sqlite")));
        if !path.exists() {
            let tmp = tempfile::Builder::new()
                .prefix("template-")
                .suffix(".making")
                .tempfile_in(dir)
                .unwrap()
                .into_temp_path();
            migrate_without_identity(&format!("sqlite://{}", tmp.display()));
            tmp.persist(&path).unwrap();
        }
        path
    })
}

/// The name of the migrated PostgreSQL database every PostgreSQL
/// [`TestDb`] is created from, made once per server and migrations set
/// under an advisory lock (the suite's tests run in many processes).
fn pg_template() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        use diesel::connection::SimpleConnection;
        use diesel::{Connection, RunQueryDsl};
        let name = format!("mailsplit_template_{}", migrations_hash("postgres"));
        let mut c = diesel::PgConnection::establish(&format!("{}/test", pg_base()))
            .expect("PostgreSQL is not reachable; set MAILSPLIT_TEST_PG");
        // why a lock: a second process must neither make it too nor copy
        // it half made; the session's end releases the lock
        c.batch_execute("SELECT pg_advisory_lock(727274)").unwrap();
        let exists = diesel::sql_query(format!(
            "SELECT 1 AS one FROM pg_database WHERE datname = '{name}'"
        ))
        .load::<One>(&mut c)
        .unwrap();
        if exists.is_empty() {
            let making = format!("{name}_making");
            // one statement per call: a batch of two is one transaction,
            // which DROP and CREATE DATABASE refuse
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {making} WITH (FORCE)"))
                .unwrap();
            c.batch_execute(&format!("CREATE DATABASE {making}"))
                .unwrap();
            migrate_without_identity(&format!("{}/{making}", pg_base()));
            c.batch_execute(&format!("ALTER DATABASE {making} RENAME TO {name}"))
                .unwrap();
        }
        c.batch_execute("SELECT pg_advisory_unlock(727274)")
            .unwrap();
        name
    })
}

#[derive(diesel::QueryableByName)]
struct One {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    #[allow(dead_code)]
    one: i32,
}

fn psql(sql: &str) {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let mut c = diesel::PgConnection::establish(&format!("{}/test", pg_base()))
        .expect("PostgreSQL is not reachable; set MAILSPLIT_TEST_PG");
    c.batch_execute(sql).unwrap();
}
