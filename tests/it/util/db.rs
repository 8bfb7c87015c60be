//! A fresh SQLite file or PostgreSQL database per test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
    pub fn new(kind: Kind) -> TestDb {
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                TestDb {
                    url: format!("sqlite://{}", dir.path().join("test.db").display()),
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
                psql(&format!("CREATE DATABASE {name}"));
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

fn psql(sql: &str) {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let mut c = diesel::PgConnection::establish(&format!("{}/test", pg_base()))
        .expect("PostgreSQL is not reachable; set MAILSPLIT_TEST_PG");
    c.batch_execute(sql).unwrap();
}
