//! `import --from-sql` can only read. Nothing after the query's
//! first statement runs (the victim table stays whole, no file appears),
//! SQLite refuses ATTACH, VACUUM INTO and PRAGMA writes, a PostgreSQL user
//! who can do more than read is refused; a row over 64 KB, or with a
//! value no attribute can hold, is skipped alone; numbers arrive exact.

use diesel::connection::SimpleConnection;
use diesel::sql_types::BigInt;
use diesel::{Connection, RunQueryDsl};

use crate::audience::{attributes, env, from_sql, from_sql_as, recipient, shop_database};
use crate::util::*;

/// Rows in `table` of the source at `url`.
fn count(kind: Kind, url: &str, table: &str) -> i64 {
    let query = diesel::select(diesel::dsl::sql::<BigInt>(&format!(
        "(SELECT COUNT(*) FROM {table})"
    )));
    match kind {
        Kind::Sqlite => {
            let path = url.trim_start_matches("sqlite://");
            let mut c = diesel::sqlite::SqliteConnection::establish(path).unwrap();
            query.get_result(&mut c).unwrap()
        }
        Kind::Postgres => {
            let mut c = diesel::pg::PgConnection::establish(url).unwrap();
            query.get_result(&mut c).unwrap()
        }
    }
}

fn exec(kind: Kind, url: &str, sql: &str) {
    match kind {
        Kind::Sqlite => {
            diesel::sqlite::SqliteConnection::establish(url.trim_start_matches("sqlite://"))
                .unwrap()
                .batch_execute(sql)
                .unwrap()
        }
        Kind::Postgres => diesel::pg::PgConnection::establish(url)
            .unwrap()
            .batch_execute(sql)
            .unwrap(),
    }
}

/// A path in /tmp, where the PostgreSQL server's user may write too.
fn fresh_path(what: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    std::env::temp_dir().join(format!("mailsplit-{what}-{}-{nanos}", std::process::id()))
}

fn assert_refused(out: &std::process::Output, query: &str) {
    assert_eq!(out.status.code(), Some(2), "{query}: {}", stderr(out));
    assert!(
        stderr(out).contains("the --from-sql query was refused"),
        "{query}: {}",
        stderr(out)
    );
}

/// Statements stacked after the query (after a `;`, or after closing the
/// parenthesis the query is wrapped in) are refused with exit 2 before
/// anything runs, even for a user who could run them: the victim table
/// keeps its row, no program runs and no file is written. On SQLite an
/// ATTACH (which would open another file read-write), VACUUM INTO and a
/// PRAGMA that writes are refused on their own too.
fn stacked_statements_are_refused(kind: Kind) {
    let env = env(kind);
    let (url, _db) = shop_database(&env, kind);
    exec(
        kind,
        &url,
        "CREATE TABLE victim (a INTEGER); INSERT INTO victim VALUES (1)",
    );
    let made = fresh_path("made");
    let shown = made.display();
    let queries = match kind {
        Kind::Sqlite => {
            let shop = url.trim_start_matches("sqlite://");
            vec![
                format!("SELECT email FROM customers; ATTACH '{shop}' AS w; DELETE FROM w.victim"),
                format!(
                    "SELECT email FROM customers) AS x; ATTACH '{shop}' AS w; \
                     SELECT * FROM (SELECT email FROM customers"
                ),
                format!("SELECT email FROM customers; ATTACH '{shown}' AS w"),
                format!("VACUUM INTO '{shown}'"),
                format!(
                    "SELECT email FROM customers) AS x; VACUUM INTO '{shown}'; \
                     SELECT * FROM (SELECT email FROM customers"
                ),
                "PRAGMA user_version = 7".to_string(),
                "SELECT email FROM customers; PRAGMA user_version = 7".to_string(),
                "SELECT email FROM customers) AS x; PRAGMA user_version = 7; \
                 SELECT * FROM (SELECT email FROM customers"
                    .to_string(),
                "DELETE FROM victim RETURNING a AS email".to_string(),
            ]
        }
        Kind::Postgres => vec![
            "SELECT email FROM customers; DROP TABLE victim".to_string(),
            format!("SELECT email FROM customers; COPY (SELECT 1) TO PROGRAM 'touch {shown}'"),
            "SELECT email FROM customers) AS x; DROP TABLE victim; \
             SELECT * FROM (SELECT email FROM customers"
                .to_string(),
            "SELECT email FROM customers -- a note\n; DELETE FROM victim".to_string(),
        ],
    };
    for query in &queries {
        let out = from_sql(&env, &url, query, &[]);
        assert_refused(&out, query);
    }
    assert_eq!(count(kind, &url, "victim"), 1);
    assert!(!made.exists(), "{shown} was written");
    if kind == Kind::Sqlite {
        let shop = url.trim_start_matches("sqlite://");
        let mut c = diesel::sqlite::SqliteConnection::establish(shop).unwrap();
        let version: i64 = diesel::select(diesel::dsl::sql::<BigInt>(
            "(SELECT user_version FROM pragma_user_version)",
        ))
        .get_result(&mut c)
        .unwrap();
        assert_eq!(version, 0);
    }
    assert!(
        !env.ok(&["list", "ls"]).contains("shop"),
        "no list was made"
    );
}

/// A row of 10 MB is refused by itself with its row number, like a CSV
/// row over 64 KB; the rows around it are imported.
fn an_oversized_row_is_skipped_alone(kind: Kind) {
    let env = env(kind);
    let (url, _db) = shop_database(&env, kind);
    let big = match kind {
        Kind::Sqlite => "replace(hex(zeroblob(5242880)), '0', 'x')",
        Kind::Postgres => "repeat('x', 10485760)",
    };
    exec(
        kind,
        &url,
        &format!(
            "CREATE TABLE notes (id INTEGER, email TEXT, note TEXT); \
             INSERT INTO notes VALUES (1, 'a@example.test', 'short'), \
             (2, 'b@example.test', {big}), (3, 'c@example.test', 'short')"
        ),
    );
    let out = from_sql(&env, &url, "SELECT email, note FROM notes ORDER BY id", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("added 2 / updated 0 / unchanged 0 / skipped 1"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("query: row 2: row longer than 65536 bytes"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        attributes(&recipient(&env, "c@example.test"))["note"],
        "short"
    );
}

/// NUMERIC values arrive as their exact text (`19.90`, not `19.9`; all 23
/// digits), integers beyond 2^53 as text, smaller ones and floats as
/// numbers. SQLite has no decimal type: its integers follow the same rule.
fn numbers_arrive_exact(kind: Kind) {
    let env = env(kind);
    let (url, _db) = shop_database(&env, kind);
    let query = match kind {
        Kind::Postgres => {
            "SELECT email, 19.90::numeric AS price, 12345678901234567890123::numeric AS code, \
             9007199254740993::int8 AS big, 9007199254740992::int8 AS edge, \
             0.5::float8 AS ratio, 7 AS n FROM customers WHERE email = 'ada@example.test'"
        }
        Kind::Sqlite => {
            "SELECT email, '19.90' AS price, 9007199254740993 AS big, \
             9007199254740992 AS edge, 0.5 AS ratio, 7 AS n \
             FROM customers WHERE email = 'ada@example.test'"
        }
    };
    let out = from_sql(&env, &url, query, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let attrs = attributes(&recipient(&env, "ada@example.test"));
    assert_eq!(attrs["price"], "19.90", "{attrs}");
    assert_eq!(attrs["big"], "9007199254740993", "{attrs}");
    assert_eq!(attrs["edge"], 9007199254740992u64, "{attrs}");
    assert_eq!(attrs["ratio"], 0.5, "{attrs}");
    assert_eq!(attrs["n"], 7, "{attrs}");
    if kind == Kind::Postgres {
        assert_eq!(attrs["code"], "12345678901234567890123", "{attrs}");
    }
}

both!(
    stacked_statements_are_refused,
    an_oversized_row_is_skipped_alone,
    numbers_arrive_exact,
);

/// A column may have any name, `s` included (once the name of an alias
/// of ours).
#[test]
fn a_pg_column_may_be_named_s() {
    let env = env(Kind::Sqlite);
    let (url, _db) = shop_database(&env, Kind::Postgres);
    let out = from_sql(
        &env,
        &url,
        "SELECT email, coupon AS s, orders AS src FROM customers",
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let bob = attributes(&recipient(&env, "bob@example.test"));
    assert_eq!(bob["s"], "X1", "{bob}");
    assert_eq!(bob["src"], 0, "{bob}");
}

/// A BLOB, or a REAL that JSON cannot hold (`1e999` is infinity), skips
/// its own row with a reason naming the column; the others are imported.
#[test]
fn a_blob_or_infinite_value_skips_only_its_row() {
    let env = env(Kind::Sqlite);
    let (url, _db) = shop_database(&env, Kind::Sqlite);
    exec(
        Kind::Sqlite,
        &url,
        "CREATE TABLE odd (id INTEGER, email TEXT, v); \
         INSERT INTO odd VALUES (1, 'a@example.test', 1), (2, 'b@example.test', x'00ff'), \
         (3, 'c@example.test', 1e999), (4, 'd@example.test', 'text')",
    );
    let out = from_sql(&env, &url, "SELECT email, v FROM odd ORDER BY id", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("added 2 / updated 0 / unchanged 0 / skipped 2"),
        "{}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("query: row 2: column \"v\" holds a BLOB"),
        "{err}"
    );
    assert!(
        err.contains("query: row 3: column \"v\" holds inf"),
        "{err}"
    );
    assert_eq!(attributes(&recipient(&env, "d@example.test"))["v"], "text");
}

/// PostgreSQL roles made for one test, dropped with it (roles belong to
/// the whole server, not to the test's database).
struct Roles {
    url: String,
    names: Vec<String>,
}

impl Roles {
    /// A login role `name_…`; `grants` run in the source's database with
    /// `{role}` standing for it. Returns the source URL as that role.
    fn add(&mut self, name: &str, grants: &str) -> String {
        let role = format!("ms_{name}_{}_{}", std::process::id(), self.names.len());
        let sql = format!(
            "CREATE ROLE {role} LOGIN; {}",
            grants.replace("{role}", &role)
        );
        exec(Kind::Postgres, &self.url, &sql);
        self.names.push(role.clone());
        self.url.replacen("://root@", &format!("://{role}@"), 1)
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        if self.names.is_empty() {
            return;
        }
        let names = self.names.join(", ");
        if let Ok(mut c) = diesel::pg::PgConnection::establish(&self.url) {
            let _ = c.batch_execute(&format!("DROP OWNED BY {names}; DROP ROLE {names}"));
        }
    }
}

/// A PostgreSQL source as a superuser, a member of pg_read_server_files or
/// the owner of a table is refused (exit 2, naming what it holds and the
/// fix) unless --allow-privileged-source; a read-only role imports, and
/// cannot read the server's files through the query.
#[test]
fn privileged_pg_sources_are_refused() {
    let env = env(Kind::Sqlite);
    let (url, _db) = shop_database(&env, Kind::Postgres);
    let mut roles = Roles {
        url: url.clone(),
        names: Vec::new(),
    };
    let query = "SELECT email FROM customers";
    let out = from_sql_as(&env, &url, query, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("can do more than read (superuser)"), "{err}");
    assert!(err.contains("--allow-privileged-source"), "{err}");

    let files = roles.add(
        "files",
        "GRANT SELECT ON customers TO {role}; GRANT pg_read_server_files TO {role}",
    );
    let out = from_sql_as(&env, &files, query, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("member of pg_read_server_files"),
        "{}",
        stderr(&out)
    );

    let owner = roles.add("owner", "ALTER TABLE customers OWNER TO {role}");
    let out = from_sql_as(&env, &owner, query, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("owner or writer of table customers"),
        "{}",
        stderr(&out)
    );
    exec(Kind::Postgres, &url, "ALTER TABLE customers OWNER TO root");

    assert!(
        !env.ok(&["list", "ls"]).contains("shop"),
        "no list was made"
    );
    let reader = roles.add("reader", "GRANT SELECT ON customers TO {role}");
    let out = from_sql_as(&env, &reader, query, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("added 2"), "{}", stdout(&out));
    let out = from_sql_as(
        &env,
        &reader,
        "SELECT email, pg_read_file('/etc/passwd') AS f FROM customers",
        &[],
    );
    assert_refused(&out, "pg_read_file");
    assert!(attributes(&recipient(&env, "ada@example.test"))
        .get("f")
        .is_none());

    let out = from_sql(&env, &url, query, &[]);
    assert!(
        out.status.success(),
        "the flag accepts a superuser: {}",
        stderr(&out)
    );
}

/// `import --help` says the password in --source shows in `ps`, and how
/// to avoid it.
#[test]
fn import_help_names_the_source_variable() {
    let env = env(Kind::Sqlite);
    let help = env.ok(&["import", "--help"]);
    assert!(help.contains("shows in `ps`"), "{help}");
    assert!(help.contains("set MAILSPLIT_SOURCE_URL instead"), "{help}");
}

/// A password typed in --source draws a warning naming the variable that
/// avoids it (and the password is not shown); the same URL from
/// MAILSPLIT_SOURCE_URL draws none.
#[test]
fn a_password_in_source_draws_a_warning() {
    let env = env(Kind::Sqlite);
    let url = "mysql://shop:Pw4Warning@127.0.0.1:1/shop";
    let query = "SELECT 'a@example.test' AS email";
    let out = from_sql(&env, url, query, &[]);
    let err = stderr(&out);
    assert!(
        err.contains("warning: the --source URL holds a password")
            && err.contains("set MAILSPLIT_SOURCE_URL instead"),
        "{err}"
    );
    assert!(!err.contains("Pw4Warning"), "{err}");
    let out = env
        .cmd(&["import", "--list", "shop", "--from-sql", query])
        .env("MAILSPLIT_SOURCE_URL", url)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(err.contains("cannot open source database"), "{err}");
    assert!(!err.contains("warning"), "{err}");
}

/// The whole way: a PostgreSQL NUMERIC `19.90` and a 23-digit code reach
/// the sent mail as written, beside a 60 KB column the templates never
/// name.
#[test]
fn a_numeric_price_reaches_the_mail_as_written() {
    use crate::content::{file, send_all};
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.ok(&["migrate"]);
    let (url, _db) = shop_database(&env, Kind::Postgres);
    let out = from_sql(
        &env,
        &url,
        "SELECT email, 19.90::numeric AS price, 12345678901234567890123::numeric AS code, \
         repeat('x', 60000) AS notes FROM customers WHERE email = 'ada@example.test'",
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let page = file(
        &env,
        "page.html",
        "<p>Price {{ attributes.price }}, code {{ attributes.code }}</p>",
    );
    env.ok(&[
        "campaign",
        "create",
        "spring",
        "--list",
        "shop",
        "--subject",
        "Price {{ attributes.price }}",
        "--from",
        "Shop <news@example.test>",
        "--html",
        &page,
    ]);
    let got = send_all(&env, peer, "spring", 1);
    let mail = parts(&got[0].1);
    assert_eq!(mail.subject, "Price 19.90");
    assert!(
        mail.html
            .contains("Price 19.90, code 12345678901234567890123"),
        "{}",
        mail.html
    );
}
