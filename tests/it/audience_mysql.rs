//! Issue 25: `import --from-sql` from MariaDB/MySQL (`mysql://`), into
//! SQLite and PostgreSQL targets; a database and password user per test.

use crate::audience::{attributes, env, from_sql, from_sql_as, members, recipient};
use crate::util::*;

/// The shop's `customers` table with every type the import maps.
fn shop(db: &MysqlDb) {
    db.exec(
        "CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(200), name VARCHAR(200), \
           opted_in TINYINT(1), vip BOOLEAN, orders INT, big BIGINT UNSIGNED, \
           spent DECIMAL(10,2), ratio DOUBLE, last_order_at DATETIME, seen TIMESTAMP NULL, \
           born DATE, coupon VARCHAR(20), level TINYINT);
         INSERT INTO customers VALUES
           (1, 'ada@example.test', 'Ada Lovelace', 1, 0, 3, 18446744073709551615, 19.90, 0.5,
            '2026-01-02 03:04:05', '2026-01-02 03:04:05', '1815-12-10', NULL, 7),
           (2, 'bob@example.test', 'Zoë Ünïcode 😀 名前', 0, 1, 0, 0, 0, NULL,
            NULL, NULL, NULL, 'X1', NULL),
           (3, 'bad-address', 'Bad', 1, 0, 1, 1, 1, 1, NULL, NULL, NULL, NULL, NULL);",
    );
}

/// Types kept (integers, unsigned, TINYINT(1) as a boolean and TINYINT as
/// a number, dates and times as RFC 3339), a DECIMAL and an integer
/// beyond 2^53 as their exact text (`19.90` stays `19.90`, no digit of
/// 2^64 - 1 is lost), NULL leaves the
/// attribute out, a non-ASCII name arrives whole, a bad row is reported by
/// row number; then `--sync` from a narrower query removes the others.
fn mysql_source_keeps_types(kind: Kind) {
    let env = env(kind);
    let db = MysqlDb::new();
    shop(&db);
    let url = db.url();
    let out = from_sql(&env, &url, "SELECT * FROM customers ORDER BY id", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out)
            .contains("added 2 / updated 0 / unchanged 0 / skipped 1 / duplicates 0 (3 rows read)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("query: row 3: invalid email"),
        "{}",
        stderr(&out)
    );
    let ada = recipient(&env, "ada@example.test");
    assert_eq!(ada.name, "Ada Lovelace");
    assert_eq!(
        attributes(&ada),
        serde_json::json!({
            "id": 1, "opted_in": true, "vip": false, "orders": 3,
            "big": "18446744073709551615", "spent": "19.90", "ratio": 0.5,
            "last_order_at": "2026-01-02T03:04:05Z", "seen": "2026-01-02T03:04:05Z",
            "born": "1815-12-10", "level": 7,
        })
    );
    let bob = recipient(&env, "bob@example.test");
    assert_eq!(bob.name, "Zoë Ünïcode 😀 名前");
    assert_eq!(
        attributes(&bob),
        serde_json::json!({
            "id": 2, "opted_in": false, "vip": true, "orders": 0, "big": 0,
            "spent": "0.00", "coupon": "X1",
        })
    );

    let out = from_sql(
        &env,
        &url,
        "SELECT email FROM customers WHERE opted_in",
        &["--sync"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("removed 1"), "{}", stdout(&out));
    assert_eq!(members(&env, "shop"), ["ada@example.test"]);
    // Recipient rows stay, with what the narrower query did not name.
    assert_eq!(recipient(&env, "bob@example.test").name, bob.name);
    assert_eq!(
        attributes(&recipient(&env, "ada@example.test"))["spent"],
        "19.90"
    );
}

/// A query without `email` is exit 2; every query that writes is refused
/// (exit 2) and leaves the shop's table as it was, including a SELECT
/// whose function writes, which only the read-only transaction stops.
fn mysql_source_refuses_writes(kind: Kind) {
    let env = env(kind);
    let db = MysqlDb::new();
    shop(&db);
    db.exec(
        "CREATE TABLE audit (email VARCHAR(200));
         DELIMITER //
         CREATE FUNCTION note(e VARCHAR(200)) RETURNS VARCHAR(200) MODIFIES SQL DATA
           BEGIN INSERT INTO audit VALUES (e); RETURN e; END //
         DELIMITER ;",
    );
    let url = db.url();
    let out = from_sql(&env, &url, "SELECT name, orders FROM customers", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no column named `email` (its columns: name, orders)"),
        "{}",
        stderr(&out)
    );
    for query in [
        "DELETE FROM customers",
        "DELETE FROM customers RETURNING email",
        "UPDATE customers SET name = 'x'",
        "DROP TABLE customers",
        "SELECT email INTO @x FROM customers LIMIT 1",
        "SELECT note(email) AS email FROM customers",
        "SELECT email FROM customers; DELETE FROM customers",
        "SELECT email FROM customers) AS x; DELETE FROM customers; \
         SELECT * FROM (SELECT email FROM customers",
    ] {
        let out = from_sql(&env, &url, query, &[]);
        assert_eq!(out.status.code(), Some(2), "{query}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("the --from-sql query was refused"),
            "{query}: {}",
            stderr(&out)
        );
    }
    assert_eq!(
        db.exec("SELECT COUNT(*), MIN(name) FROM customers; SELECT COUNT(*) FROM audit;"),
        "3\tAda Lovelace\n0\n"
    );
    assert!(
        !env.ok(&["list", "ls"]).contains("shop"),
        "no list was made"
    );
}

both!(mysql_source_keeps_types, mysql_source_refuses_writes);

/// A user who can write the database (the test's own, granted ALL on it)
/// is refused, exit 2, naming the privileges and the fix, unless
/// --allow-privileged-source; a user granted SELECT only imports, and
/// cannot read the server's files (`LOAD_FILE` needs FILE).
#[test]
fn mysql_privileged_users_are_refused() {
    let env = env(Kind::Sqlite);
    let db = MysqlDb::new();
    shop(&db);
    let query = "SELECT email, LOAD_FILE('/etc/passwd') AS f FROM customers";
    let out = from_sql_as(&env, &db.url(), query, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("can do more than read (privileges "), "{err}");
    assert!(err.contains("INSERT"), "{err}");
    assert!(err.contains("--allow-privileged-source"), "{err}");
    assert!(
        !env.ok(&["list", "ls"]).contains("shop"),
        "no list was made"
    );
    let reader = format!("{}r", db.user);
    db.exec(&format!(
        "CREATE USER '{reader}'@'%' IDENTIFIED BY '{pw}'; \
         CREATE USER '{reader}'@'localhost' IDENTIFIED BY '{pw}'; \
         GRANT SELECT ON {name}.* TO '{reader}'@'%'; \
         GRANT SELECT ON {name}.* TO '{reader}'@'localhost';",
        pw = db.password,
        name = db.name
    ));
    let url = db
        .url()
        .replacen(&format!("//{}:", db.user), &format!("//{reader}:"), 1);
    let out = from_sql_as(&env, &url, query, &[]);
    db.exec(&format!(
        "DROP USER '{reader}'@'%'; DROP USER '{reader}'@'localhost';"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("added 2"), "{}", stdout(&out));
    assert!(attributes(&recipient(&env, "ada@example.test"))
        .get("f")
        .is_none());
}

/// A 10 MB row is refused by itself with its row number; the rows
/// around it are imported.
#[test]
fn mysql_oversized_row_is_skipped_alone() {
    let env = env(Kind::Sqlite);
    let db = MysqlDb::new();
    db.exec(
        "CREATE TABLE notes (id INT, email VARCHAR(200), note LONGTEXT); \
         INSERT INTO notes VALUES (1, 'a@example.test', 'short'), \
           (2, 'b@example.test', REPEAT('x', 10485760)), (3, 'c@example.test', 'short');",
    );
    let out = from_sql(
        &env,
        &db.url(),
        "SELECT email, note FROM notes ORDER BY id",
        &[],
    );
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
}

/// A wrong password is exit 1, and the password appears nowhere.
#[test]
fn mysql_login_failure_hides_the_password() {
    let env = env(Kind::Sqlite);
    let db = MysqlDb::new();
    let url = db.url().replace(&db.password, "Wr0ngS3cretPw");
    let out = from_sql(&env, &url, "SELECT 'a@example.test' AS email", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("Wr0ngS3cretPw"), "{err}");
    assert!(!err.contains(&db.password), "{err}");
    assert!(err.contains("cannot open source database"), "{err}");
    assert!(err.contains("Access denied"), "{err}");
    // The server's words, not the driver's wrapping of them.
    assert!(err.contains("(MySQL error 1045"), "{err}");
    assert!(!err.contains("MySqlError {"), "{err}");
}

/// A password with an unencoded `/` makes the URL unparsable: the error
/// says to percent-encode it, and shows no part of the password.
#[test]
fn mysql_url_with_an_unencoded_slash_says_to_percent_encode() {
    let env = env(Kind::Sqlite);
    let url = "mysql://shop:pa/ssW0rdX@127.0.0.1:3306/shop";
    let out = from_sql(&env, url, "SELECT 'a@example.test' AS email", &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("percent-encode") && err.contains("%2F"),
        "{err}"
    );
    assert!(!err.contains("ParseError {"), "{err}");
    assert!(!err.contains("ssW0rdX"), "{err}");
}
