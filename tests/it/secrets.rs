//! Secrets: no password is ever printed (bad SMTP and database URLs, a
//! driver that quotes the password, clap's complaints, `--help`, the
//! scripts' banners); no password travels in clear text unless the URL
//! says so for a loopback relay; a password reaches the relay exactly as
//! written in the URL; and what holds recipients' data on disk (the SQLite
//! database with its -wal and -shm, run directories, logs) is private to
//! its owner. Against the real binary, scripts, PostgreSQL, supervisord,
//! beanstalkd and the scripted SMTP peer.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::util::*;

/// A password nobody could mistake for anything else in a log.
const SECRET: &str = "Sup3rS3cretPw";

/// Everything a command printed.
fn printed(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "{what} printed the password:\n{text}"
    );
}

/// `env.run`, failing the test if the command has not exited within 20 s
/// (a refusal that does not happen must not hang the suite).
fn run(env: &Env, args: &[&str]) -> Output {
    output_within(&mut env.cmd(args), 20)
}

/// Permission bits of a path.
fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// No group or other permission bits: private to the owner.
fn assert_private(path: &Path) {
    let m = mode(path);
    assert_eq!(m & 0o077, 0, "{} has mode {m:o}", path.display());
}

/// Run `program args…` under the permissive umask 022, so what a file ends
/// up as is the program's own doing.
fn under_umask_022(program: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("umask 022; exec \"$0\" \"$@\"")
        .arg(program)
        .args(args);
    c
}

// ------------------------------------------------------------- item 10

#[test]
fn bad_smtp_urls_and_clap_errors_never_show_the_password() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    for url in [
        format!("smtp://mailer:{SECRET}@127.0.0.1:notaport"),
        format!("smtp://mailer:{SECRET}@127.0.0.1:25?tls=bogus"),
        format!("smtp://mailer:{SECRET}@[::1"),
        format!("http://mailer:{SECRET}@127.0.0.1:25"),
    ] {
        // As an option and from the environment.
        let out = run(&env, &["worker", "--smtp", &url]);
        assert_eq!(out.status.code(), Some(2), "{url}: {}", printed(&out));
        assert_hidden(&url, &printed(&out));
        assert!(stderr(&out).contains("mailer:***@"), "{}", stderr(&out));
        let out = output_within(env.cmd(&["worker"]).env("SMTP_URL", &url), 20);
        assert_eq!(out.status.code(), Some(2), "{url}: {}", printed(&out));
        assert_hidden(&url, &printed(&out));
    }
    // clap quotes what it did not expect: a URL typed without --smtp.
    let url = format!("smtp://mailer:{SECRET}@relay.example:587?tls=required");
    for args in [
        vec!["worker", url.as_str()],
        vec!["worker", "--smtp", url.as_str(), "--concurrency", "many"],
        vec!["--database-url", url.as_str(), "bogus-command"],
        vec!["status", url.as_str(), "extra"],
    ] {
        let out = run(&env, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", printed(&out));
        assert_hidden(&format!("{args:?}"), &printed(&out));
    }
    let out = run(&env, &["worker", &url]);
    assert!(
        stderr(&out).contains("mailer:***@relay.example"),
        "{}",
        stderr(&out)
    );
    // --help shows where a value comes from, never the value.
    for args in [
        &["worker", "--help"][..],
        &["--help"],
        &["status", "--help"],
    ] {
        let out = output_within(
            env.cmd(args)
                .env("SMTP_URL", &url)
                .env("DATABASE_URL", format!("postgres://me:{SECRET}@db/x")),
            20,
        );
        assert!(out.status.success(), "{}", printed(&out));
        assert_hidden(&format!("{args:?}"), &printed(&out));
    }
}

#[test]
fn database_urls_never_show_the_password() {
    let env = World::new(Kind::Sqlite);
    let base = pg_base().replace("postgres://", "");
    let host = base.rsplit('@').next().unwrap().to_string();
    for url in [
        // libpq quotes a badly percent-encoded password on its own.
        format!("postgres://root:p%zz{SECRET}@{host}/mailsplit"),
        format!("postgres://root:{SECRET}@{host}/no_such_database_here"),
        format!("postgres://root:{SECRET}@127.0.0.1:notaport/x"),
        format!("postgres://root@{host}/no_such_database_here?password={SECRET}"),
        format!("mysql://root:{SECRET}@{host}/x"),
    ] {
        for args in [
            &["migrate"][..],
            &["status"],
            &["campaign", "list"],
            &["worker"],
        ] {
            let out = output_within(env.cmd(args).env("DATABASE_URL", &url), 20);
            assert!(!out.status.success(), "{url} {args:?}: {}", printed(&out));
            assert_hidden(&format!("{url} {args:?}"), &printed(&out));
            assert!(
                stderr(&out).contains("mailsplit: error:"),
                "{}",
                printed(&out)
            );
        }
    }
    // The same from --database-url.
    let url = format!("postgres://root:p%zz{SECRET}@{host}/x");
    let out = run(&env, &["status", "--database-url", &url]);
    assert_hidden("--database-url", &printed(&out));
}

/// `scripts/workers.sh start` prints its banner with both URLs; the
/// workers' logs and the run directory are private (item 13).
#[test]
fn workers_script_banner_hides_passwords_and_its_files_are_private() {
    let (tmp, _bs, mut env) = env_with_beanstalkd(Kind::Postgres);
    // The server trusts loopback connections, so the password is ignored
    // and the workers really run.
    let db_url = env
        .db
        .url
        .replacen("postgres://root@", &format!("postgres://root:{SECRET}@"), 1);
    assert_ne!(db_url, env.db.url);
    let peer = ScriptedSmtp::start(Script::default());
    env.smtp = format!(
        "smtp://mailer:{SECRET}@127.0.0.1:{}?tls=required",
        peer.port
    );
    env.ok(&["migrate"]);
    let run = tmp.path().join("run");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/workers.sh");
    let dir = run.to_str().unwrap();
    let start = under_umask_022(
        &script,
        &["start", "--workers", "1", "--dir", dir, "--bin", BIN],
    )
    .env("DATABASE_URL", &db_url)
    .env("BEANSTALKD", &env.beanstalkd)
    .env("MAILSPLIT_TUBE", &env.tube)
    .env("SMTP_URL", &env.smtp)
    .output()
    .unwrap();
    // Stopped whatever happens below, so a failing assertion leaves no
    // supervisord behind.
    struct Stop<'a>(&'a Path, &'a str);
    impl Stop<'_> {
        fn now(&self) -> Output {
            Command::new(self.0)
                .args(["stop", "--dir", self.1])
                .output()
                .unwrap()
        }
    }
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.now();
        }
    }
    let workers = Stop(&script, dir);
    assert!(
        start.status.success(),
        "workers.sh start failed: {}",
        printed(&start)
    );
    assert_hidden("workers.sh start", &printed(&start));
    assert!(
        stdout(&start).contains("root:***@") && stdout(&start).contains("mailer:***@"),
        "{}",
        printed(&start)
    );
    std::thread::sleep(Duration::from_millis(500));
    let stopped = workers.now();
    assert!(stopped.status.success(), "{}", printed(&stopped));
    assert_eq!(mode(&run), 0o700, "run directory");
    let mut logs = 0;
    for entry in std::fs::read_dir(&run).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".log") {
            logs += 1;
            assert_private(&entry.path());
            let text = std::fs::read_to_string(entry.path()).unwrap();
            assert_hidden(&name, &text);
        }
    }
    assert!(logs >= 2, "expected supervisord's and a worker's log");
}

// ------------------------------------------------------------- item 11

fn auth_peer(tls: PeerTls) -> ScriptedSmtp {
    ScriptedSmtp::start(Script {
        tls,
        auth: Some(("mailer".into(), SECRET.into())),
        ..Script::default()
    })
}

fn wait_sent(env: &Env, n: i64) {
    wait_for(60, "the campaign to be sent", || {
        env.status("news")["sent"] == n
    });
}

#[test]
fn a_password_never_travels_in_clear_text() {
    let (tmp, _bs, mut env) = env_with_beanstalkd(Kind::Sqlite);
    env.campaign("news", 5);

    // No TLS asked for: refused before anything connects, naming the fixes.
    let clear = auth_peer(PeerTls::None);
    let url = format!("smtp://mailer:{SECRET}@127.0.0.1:{}", clear.port);
    let out = run(&env, &["worker", "--smtp", &url]);
    assert_eq!(out.status.code(), Some(2), "{}", printed(&out));
    let err = stderr(&out);
    assert!(
        err.contains("tls=required") && err.contains("smtps://"),
        "{err}"
    );
    assert!(err.contains("auth=plain-insecure"), "{err}");
    assert_hidden("worker", &err);
    assert_eq!(clear.sessions.load(std::sync::atomic::Ordering::SeqCst), 0);

    // tls=opportunistic against a relay that offers no STARTTLS (or a man
    // in the middle who strips it): the password is not sent, nor the mail.
    env.smtp = format!("{url}?tls=opportunistic");
    let w = env.worker(&["--concurrency", "2", "--grace", "1"]);
    wait_for(20, "the worker to try the relay", || {
        clear.sessions.load(std::sync::atomic::Ordering::SeqCst) >= 2
    });
    std::thread::sleep(Duration::from_millis(500));
    let log = stop_worker(w);
    assert_eq!(
        *clear.auths.lock().unwrap(),
        vec![],
        "AUTH went out in clear"
    );
    assert_eq!(clear.total(), 0);
    assert_eq!(env.status("news")["sent"], 0);
    assert!(log.contains("not encrypted"), "{log}");
    assert_hidden("worker log", &log);

    // The same URL where STARTTLS is offered: AUTH over TLS, mail delivered.
    let (config, ca) = tls_identity(tmp.path());
    let tls = auth_peer(PeerTls::StartTls(config));
    env.smtp = format!(
        "smtp://mailer:{SECRET}@localhost:{}?tls=opportunistic&ca={}",
        tls.port,
        ca.display()
    );
    let w = env.worker(&["--concurrency", "2"]);
    wait_sent(&env, 5);
    drop(w);
    let auths = tls.auths.lock().unwrap().clone();
    assert!(!auths.is_empty());
    assert!(auths.iter().all(|a| a.encrypted && a.accepted), "{auths:?}");
    assert_eq!(tls.total(), 5);
}

#[test]
fn auth_in_clear_only_when_the_url_says_so_for_a_loopback_relay() {
    let mut env = World::new(Kind::Sqlite);
    env.campaign("news", 5);
    let peer = auth_peer(PeerTls::None);
    let out = run(
        &env,
        &[
            "worker",
            "--smtp",
            &format!("smtp://mailer:{SECRET}@relay.example:25?tls=none&auth=plain-insecure"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", printed(&out));
    assert!(stderr(&out).contains("this machine"), "{}", printed(&out));
    assert_hidden("worker", &printed(&out));

    env.smtp = format!(
        "smtp://mailer:{SECRET}@127.0.0.1:{}?tls=none&auth=plain-insecure",
        peer.port
    );
    let _w = env.worker(&["--concurrency", "2"]);
    wait_sent(&env, 5);
    let auths = peer.auths.lock().unwrap().clone();
    assert!(!auths.is_empty());
    assert!(
        auths.iter().all(|a| !a.encrypted && a.accepted),
        "{auths:?}"
    );
}

// ------------------------------------------------------------- item 12

#[test]
fn the_password_reaches_the_relay_exactly_as_written() {
    let (tmp, _bs, mut env) = env_with_beanstalkd(Kind::Sqlite);
    let (config, ca) = tls_identity(tmp.path());
    // A literal '+', and percent-escapes that must be decoded once.
    let password = "p+ss w%rd/@x";
    let peer = ScriptedSmtp::start(Script {
        tls: PeerTls::StartTls(config),
        auth: Some(("ada@example.test".into(), password.into())),
        ..Script::default()
    });
    env.campaign("news", 5);
    env.smtp = format!(
        "smtp://ada%40example.test:p+ss%20w%25rd%2F%40x@localhost:{}?tls=required&ca={}",
        peer.port,
        ca.display()
    );
    let w = env.worker(&["--concurrency", "2"]);
    wait_for(30, "the campaign to be sent", || {
        env.status("news")["sent"] == 5
    });
    let log = stop_worker(w);
    let auths = peer.auths.lock().unwrap().clone();
    assert!(
        auths.iter().all(|a| a.password == password && a.accepted),
        "{auths:?}\n{log}"
    );

    // A wrong password: the log says the relay refused the login and what
    // to check, without the password.
    let peer = auth_peer(PeerTls::None);
    env.smtp = format!(
        "smtp://mailer:wrong{SECRET}@127.0.0.1:{}?tls=none&auth=plain-insecure",
        peer.port
    );
    env.campaign("other", 1);
    let w = env.worker(&["--concurrency", "1", "--grace", "1"]);
    wait_for(20, "a login to be refused", || {
        !peer.auths.lock().unwrap().is_empty()
    });
    std::thread::sleep(Duration::from_millis(300));
    let log = stop_worker(w);
    assert!(log.contains("refused the login"), "{log}");
    assert!(log.contains("535"), "{log}");
    assert_hidden("worker log", &log);
}

// ------------------------------------------------------------- item 13

#[test]
fn the_sqlite_database_and_its_wal_are_private() {
    let (tmp, _bs, mut env) = env_with_beanstalkd(Kind::Sqlite);
    let sink = SmtpSink::start(&[]);
    env.smtp = sink.url();
    let db = tmp.path().join("people.db");
    env.db.url = format!("sqlite://{}", db.display());
    let out = output_within(
        under_umask_022(Path::new(BIN), &["migrate"]).env("DATABASE_URL", &env.db.url),
        20,
    );
    assert!(out.status.success(), "{}", printed(&out));
    assert_eq!(mode(&db), 0o600);
    env.campaign("news", 20);
    let _w = env.worker(&[]);
    wait_for(60, "the campaign to be sent", || {
        env.status("news")["sent"] == 20
    });
    for suffix in ["", "-wal", "-shm"] {
        let path = tmp.path().join(format!("people.db{suffix}"));
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    // An existing world-readable database is left as it is, and said.
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&env, &["migrate"]);
    assert!(stderr(&out).contains("chmod 600"), "{}", printed(&out));
    assert_eq!(mode(&db), 0o644);
}

#[test]
fn services_script_files_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services.sh");
    let dir = run.to_str().unwrap();
    let out = under_umask_022(&script, &["start", "--dir", dir])
        .output()
        .unwrap();
    let stop = Command::new(&script).args(["stop", "--dir", dir]).output();
    assert!(out.status.success(), "{}", printed(&out));
    assert!(stop.unwrap().status.success());
    assert_eq!(mode(&run), 0o700);
    assert_eq!(mode(&run.join("binlog")), 0o700);
    for file in ["beanstalkd.log", "smtp-sink.log"] {
        assert_private(&run.join(file));
    }
    // beanstalkd's binlog holds the queued jobs.
    for entry in std::fs::read_dir(run.join("binlog")).unwrap().flatten() {
        assert_private(&entry.path());
    }
}
