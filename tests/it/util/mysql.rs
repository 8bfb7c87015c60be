//! A MariaDB/MySQL database and a password user of its own per test,
//! created and dropped through `mysql -uroot` (the server's socket); the
//! binary under test reaches it over TCP with the password.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Host and port the binary connects to (`MAILSPLIT_TEST_MYSQL`).
pub fn mysql_addr() -> String {
    std::env::var("MAILSPLIT_TEST_MYSQL").unwrap_or_else(|_| "127.0.0.1:3306".into())
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A database and a user allowed into it only, dropped with the value.
pub struct MysqlDb {
    pub name: String,
    pub user: String,
    pub password: String,
}

impl MysqlDb {
    pub fn new() -> MysqlDb {
        let seq = SEQ.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let tag = format!("{}_{seq}_{nanos}", std::process::id());
        let db = MysqlDb {
            name: format!("mailsplit_t{tag}"),
            user: format!("ms{tag}"),
            password: format!("Pw{nanos}x{seq}Secret"),
        };
        let (user, password, name) = (&db.user, &db.password, &db.name);
        mysql_root(&format!(
            "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
             CREATE USER '{user}'@'%' IDENTIFIED BY '{password}';
             CREATE USER '{user}'@'localhost' IDENTIFIED BY '{password}';
             GRANT ALL ON {name}.* TO '{user}'@'%';
             GRANT ALL ON {name}.* TO '{user}'@'localhost';"
        ));
        db
    }

    /// The source URL, password included.
    pub fn url(&self) -> String {
        format!(
            "mysql://{}:{}@{}/{}",
            self.user,
            self.password,
            mysql_addr(),
            self.name
        )
    }

    /// Run `sql` as root in this database; returns the rows, tab-separated.
    pub fn exec(&self, sql: &str) -> String {
        mysql_in(Some(&self.name), sql)
    }
}

impl Drop for MysqlDb {
    fn drop(&mut self) {
        mysql_root(&format!(
            "DROP DATABASE IF EXISTS {}; DROP USER IF EXISTS '{}'@'%', '{}'@'localhost';",
            self.name, self.user, self.user
        ));
    }
}

fn mysql_root(sql: &str) {
    mysql_in(None, sql);
}

fn mysql_in(database: Option<&str>, sql: &str) -> String {
    let mut cmd = Command::new("mysql");
    cmd.args(["-uroot", "--default-character-set=utf8mb4", "-N", "-B"]);
    cmd.args(database);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mysql client (MariaDB) is not installed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "mysql -uroot failed: {}\n{sql}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
