//! `Env`: everything one test's commands share (database, beanstalkd,
//! SMTP URL), and running the binary against it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::*;

/// Everything one test's commands share.
pub struct Env {
    /// The session [`Env::status`] reads through on PostgreSQL (first
    /// field: it closes before the database is dropped).
    status_conn: Mutex<Option<mailsplit::store::Conn>>,
    pub db: TestDb,
    pub beanstalkd: String,
    pub tube: String,
    pub smtp: String,
    pub dir: tempfile::TempDir,
    /// More variables for every command (see [`World::var`]).
    pub vars: Vec<(String, String)>,
}

impl Env {
    /// An environment on a database with the schema in place but no
    /// identity yet ([`TestDb::new`]): the test's first `migrate` is a
    /// fresh install's, without the cost of the migrations.
    pub fn new(kind: Kind, beanstalkd: &str) -> Env {
        Env::on(TestDb::new(kind), beanstalkd)
    }
    /// An environment on a database with nothing in it ([`TestDb::empty`]).
    pub fn empty(kind: Kind, beanstalkd: &str) -> Env {
        Env::on(TestDb::empty(kind), beanstalkd)
    }
    fn on(db: TestDb, beanstalkd: &str) -> Env {
        Env {
            status_conn: Mutex::new(None),
            db,
            beanstalkd: beanstalkd.to_string(),
            tube: format!("t{}", free_port()),
            smtp: "smtp://127.0.0.1:1".into(),
            dir: tempfile::tempdir().unwrap(),
            vars: Vec::new(),
        }
    }
    /// Leases of `ms` instead of 30 s for every command (the hidden
    /// `MAILSPLIT_LEASE_MS`): for tests that kill a process and then wait
    /// out its lease; the rules stay the same, only the wait shrinks.
    pub fn short_lease(mut self, ms: u64) -> Env {
        self.vars
            .push(("MAILSPLIT_LEASE_MS".to_string(), ms.to_string()));
        self
    }
    /// The binary with this environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(self.dir.path())
            .env("DATABASE_URL", &self.db.url)
            .env("BEANSTALKD", &self.beanstalkd)
            .env("MAILSPLIT_TUBE", &self.tube)
            .env("SMTP_URL", &self.smtp)
            .env("MAILSPLIT_LOG", "info")
            // A default from the caller's environment would change what
            // `campaign create` does; tests set it where they mean it.
            .env_remove("MAILSPLIT_PUBLIC_URL");
        c.envs(self.vars.iter().map(|(k, v)| (k, v)));
        c
    }
    /// Run to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
    /// Run and insist on exit 0; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "mailsplit {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// Write a CSV of `n` recipients `user{i}@example.test` and import it.
    pub fn import_n(&self, list: &str, n: usize) {
        let path = self.dir.path().join(format!("{list}.csv"));
        write_csv(&path, n);
        self.ok(&["migrate"]);
        self.ok(&["import", path.to_str().unwrap(), "--list", list]);
    }
    /// The same list as [`Env::import_n`] (`user{i}@example.test`, in id
    /// order), but user1 goes through `import` and the rest through one
    /// SQL statement: for tests about what comes after the import (enqueue
    /// kills), where importing 150,000 rows from a CSV took a minute or two.
    pub fn import_bulk(&self, list: &str, n: usize) {
        self.import_n(list, 1);
        if n < 2 {
            return;
        }
        self.sql(&format!(
            "WITH RECURSIVE s(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) \
             INSERT INTO recipients (email, name, attributes, status, updated_at, email_key) \
             SELECT 'user' || i || '@example.test', 'User ' || i, \
             '{{\"city\":\"City ' || (i % 7) || '\"}}', 'active', \
             (SELECT MAX(updated_at) FROM recipients), 'user' || i || '@example.test' FROM s"
        ));
        self.sql(&format!(
            "INSERT INTO list_members (list_id, recipient_id) \
             SELECT (SELECT id FROM lists WHERE name = '{list}'), r.id FROM recipients r \
             WHERE NOT EXISTS (SELECT 1 FROM list_members m WHERE m.recipient_id = r.id)"
        ));
    }
    /// Migrate, import `n` recipients, create and enqueue campaign `name`.
    pub fn campaign(&self, name: &str, n: usize) {
        self.campaign_without_enqueue(name, n);
        self.ok(&["enqueue", name]);
    }
    /// Migrate, import `n` recipients into list `name`, create campaign
    /// `name` for it.
    pub fn campaign_without_enqueue(&self, name: &str, n: usize) {
        self.import_n(name, n);
        self.create_campaign(name, name, &[]);
    }
    /// [`Env::campaign_without_enqueue`] with the list from [`Env::import_bulk`].
    pub fn bulk_campaign_without_enqueue(&self, name: &str, n: usize) {
        self.import_bulk(name, n);
        self.create_campaign(name, name, &[]);
    }
    /// `status --json` of one campaign: what the binary prints, from the
    /// library call it makes (`campaign::statuses`), made here. Why: tests
    /// poll it many times a second, and a process per poll with its own
    /// database session cost about 30 ms of the binary's CPU and 25 ms of
    /// a PostgreSQL backend's, the largest share of the suite's CPU. The
    /// binary answers when the test set variables for it (they may change
    /// what status computes, e.g. the rate window) and whenever this
    /// process cannot read (its error is the one to show).
    pub fn status(&self, name: &str) -> serde_json::Value {
        if self.vars.is_empty() {
            if let Some(status) = self.status_here(name) {
                return status;
            }
        }
        self.binary_status(name)
    }
    /// `mailsplit status NAME --json`, run.
    pub fn binary_status(&self, name: &str) -> serde_json::Value {
        let out = self.ok(&["status", name, "--json"]);
        serde_json::from_str(out.trim()).unwrap()
    }
    /// [`Env::status`] in this process, or None when it cannot read. The
    /// PostgreSQL session is kept between polls; a SQLite file is opened
    /// each time (cheap, and a test may replace the file).
    fn status_here(&self, name: &str) -> Option<serde_json::Value> {
        let mut slot = self.status_conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut conn = match slot.take() {
            Some(conn) => conn,
            None => mailsplit::store::open_read_only(&self.db.url).ok()?,
        };
        let mut shown = mailsplit::campaign::statuses(&mut conn, Some(name)).ok()?;
        if self.db.kind() == Kind::Postgres {
            *slot = Some(conn);
        }
        match (shown.pop(), shown.is_empty()) {
            (Some(one), true) => serde_json::to_value(one).ok(),
            _ => None,
        }
    }
    /// `workers --json`: one object per heartbeat row.
    pub fn workers(&self) -> Vec<serde_json::Value> {
        self.ok(&["workers", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
    /// Start a worker in the background.
    pub fn worker(&self, extra: &[&str]) -> Proc {
        let mut args = vec!["worker", "--smtp", &self.smtp];
        args.extend_from_slice(extra);
        let mut child = self
            .cmd(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        super::log::unblock(&mut child);
        Proc(child)
    }
    /// Run SQL against the test database.
    pub fn sql(&self, sql: &str) {
        let mut c = mailsplit::store::Conn::open(&self.db.url).unwrap();
        c.execute_batch(sql).unwrap();
    }
    /// Rows of two text columns that `sql` selects.
    pub fn text_pairs(&self, sql: &str) -> Vec<(String, String)> {
        use diesel::sql_types::Text;
        use diesel::{Connection, QueryableByName, RunQueryDsl};
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = Text)]
            a: String,
            #[diesel(sql_type = Text)]
            b: String,
        }
        let q = diesel::sql_query(sql);
        let rows: Vec<Row> = match self.db.url.strip_prefix("sqlite://") {
            Some(path) => q
                .load(&mut diesel::SqliteConnection::establish(path).unwrap())
                .unwrap(),
            None => q
                .load(&mut diesel::PgConnection::establish(&self.db.url).unwrap())
                .unwrap(),
        };
        rows.into_iter().map(|r| (r.a, r.b)).collect()
    }
    pub fn conn(&self) -> mailsplit::store::Conn {
        mailsplit::store::Conn::open(&self.db.url).unwrap()
    }
    /// This database's identity (after `migrate`).
    pub fn identity(&self) -> mailsplit::tokens::Identity {
        let installed = mailsplit::store::installation::load(&mut self.conn()).unwrap();
        mailsplit::tokens::Identity::from(&installed)
    }
    /// A job body exactly as `enqueue` would put it: signed for this
    /// database.
    pub fn signed_job(&self, campaign: i64, recipients: &[i64]) -> Vec<u8> {
        mailsplit::queue::JobBody::new(campaign, recipients.to_vec()).encode(&self.identity())
    }
    /// `campaign create NAME --list LIST --template newsletter --subject
    /// Hello --from news@example.test`, plus `extra` options.
    pub fn try_create_campaign(&self, name: &str, list: &str, extra: &[&str]) -> Output {
        self.try_create_campaign_from(name, list, "news@example.test", extra)
    }
    /// Like [`Env::try_create_campaign`], with another `--from`.
    pub fn try_create_campaign_from(
        &self,
        name: &str,
        list: &str,
        from: &str,
        extra: &[&str],
    ) -> Output {
        let mut args = vec![
            "campaign",
            "create",
            name,
            "--list",
            list,
            "--template",
            "newsletter",
            "--subject",
            "Hello",
            "--from",
            from,
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }
    /// Like [`Env::try_create_campaign`], insisting on success; returns stdout.
    pub fn create_campaign(&self, name: &str, list: &str, extra: &[&str]) -> String {
        let out = self.try_create_campaign(name, list, extra);
        assert!(
            out.status.success(),
            "campaign create {name} failed: {}{}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }
}

/// A beanstalkd, a scripted peer and an environment pointing at both.
pub fn setup(kind: Kind, script: Script) -> (tempfile::TempDir, Beanstalkd, ScriptedSmtp, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(script);
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    (tmp, bs, peer, env)
}

/// A peer slow enough (20 ms per message) that a campaign takes seconds.
pub fn slow() -> Script {
    Script {
        data_delay: Duration::from_millis(20),
        ..Script::default()
    }
}

/// Recipient ids of a list, in id order.
pub fn member_ids(env: &Env, list: &str) -> Vec<i64> {
    use mailsplit::store::recipients;
    let mut conn = env.conn();
    let list_id = recipients::find_list(&mut conn, list).unwrap();
    recipients::member_page(&mut conn, list_id, 0, i64::MAX)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

pub fn write_csv(path: &Path, n: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "email,name,city").unwrap();
    for i in 1..=n {
        writeln!(f, "user{i}@example.test,User {i},City {}", i % 7).unwrap();
    }
}

/// The values of a header of a message (its top-level header section),
/// unfolded.
pub fn header(message: &str, name: &str) -> Vec<String> {
    let head = &message[..message.find("\r\n\r\n").unwrap_or(message.len())];
    head.replace("\r\n ", " ")
        .replace("\r\n\t", " ")
        .split("\r\n")
        .filter(|l| {
            l.len() > name.len()
                && l[..name.len()].eq_ignore_ascii_case(name)
                && l.as_bytes()[name.len()] == b':'
        })
        .map(|l| l[name.len() + 1..].trim().to_string())
        .collect()
}

/// A message's subject and its HTML and text parts, transfer-decoded by
/// mail-parser (empty where the message has no such part).
pub struct Parts {
    pub subject: String,
    pub html: String,
    pub text: String,
}

pub fn parts(message: &str) -> Parts {
    let m = mail_parser::MessageParser::default()
        .parse(message.as_bytes())
        .expect("a MIME message");
    Parts {
        subject: m.subject().unwrap_or_default().to_string(),
        html: m.body_html(0).map(|h| h.to_string()).unwrap_or_default(),
        text: m.body_text(0).map(|t| t.to_string()).unwrap_or_default(),
    }
}

/// Stop a worker started by [`Env::worker`] with SIGTERM, insist on a
/// clean exit, and return what it logged.
pub fn stop_worker(mut w: Proc) -> String {
    signal(&w.0, "TERM");
    let status = wait_exit(&mut w.0, 30);
    let mut log = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(
        status.success(),
        "worker did not exit 0 ({status}); its log:\n{log}"
    );
    log
}

/// A beanstalkd (with a binlog in a fresh directory) and an environment
/// on it with a fresh database of `kind`.
pub fn env_with_beanstalkd(kind: Kind) -> (tempfile::TempDir, Beanstalkd, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    (tmp, bs, env)
}

/// A running `mailsplit serve` (public and admin listeners), killed when
/// dropped.
pub struct Served {
    pub proc: Proc,
    pub public: u16,
    pub admin: u16,
}

impl Env {
    /// `mailsplit serve` on free ports, with `token` as
    /// MAILSPLIT_ADMIN_TOKEN (none: loopback-only, open).
    pub fn serve(&self, token: Option<&str>) -> Served {
        let (public, admin) = (free_port(), free_port());
        let mut cmd = self.cmd(&[
            "serve",
            "--listen",
            &format!("127.0.0.1:{public}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ]);
        cmd.env_remove("MAILSPLIT_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(t) = token {
            cmd.env("MAILSPLIT_ADMIN_TOKEN", t);
        }
        let proc = Proc(cmd.spawn().unwrap());
        wait_port(public);
        wait_port(admin);
        Served {
            proc,
            public,
            admin,
        }
    }
}

/// How a run resolved the previous run's in-doubt window (from its log):
/// how many of its recipients were found and how many put again.
pub fn in_doubt_outcome(log: &str) -> String {
    let Some(line) = log.lines().find(|l| l.contains("interrupted run resolved")) else {
        return "none".into();
    };
    let field = |name: &str| {
        line.split_once(&format!("{name}="))
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    format!(
        "{} found in the queue, {} in the ledger, {} put again",
        field("found_in_queue"),
        field("found_in_ledger"),
        field("put_again")
    )
}

/// Wait up to `secs` seconds until campaign `name` has nothing pending
/// (`mailsplit status --json`); on timeout the panic shows its last status.
pub fn wait_done(env: &Env, name: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let status = env.status(name);
        if status["pending"] == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "campaign {name} not finished after {secs} s: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
