//! A private Postfix instance for tests: its own `main.cf` and `master.cf`,
//! queue and data directories under a temp dir, an SMTP listener on a free
//! loopback port, routes by `transport_maps` (or a `relayhost`), optional
//! pipe(8) transports, process limits; stopped (and its master killed if
//! need be) on drop. It runs beside any system Postfix: `postfix -c DIR`
//! reads only DIR, and nothing here touches `/etc/postfix` or the default
//! queue (only the compiled-in `meta_directory`, `/etc/postfix/postfix-files`,
//! is read to lay out the queue).
//!
//! Needs root (Postfix's master runs as root and drops to `mail_owner`
//! `postfix`) and the Debian package `postfix`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{free_port, wait_port};

/// A pipe(8) transport: `NAME unix - n n - MAXPROC pipe flags=… user=… argv=…`.
#[derive(Clone, Debug)]
pub struct Pipe {
    pub name: String,
    /// Unprivileged user the command runs as (not root, not postfix).
    pub user: String,
    pub flags: String,
    /// The command line, with pipe(8) macros such as `${recipient}`.
    pub argv: String,
    /// Recipients per delivery (`NAME_destination_recipient_limit`); 1 makes
    /// `${recipient}` one address.
    pub recipient_limit: u32,
    pub max_processes: u32,
}

/// How to set the instance up. `Default` gives an instance that accepts
/// mail from loopback on its SMTP port and delivers by DNS (useless in a
/// test): add `transports` or a `relayhost`.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `transport_maps` entries: a domain (or `user@domain`, `.domain`) and
    /// its transport, e.g. `("example.test", "smtp:[127.0.0.1]:2525")`.
    pub transports: Vec<(String, String)>,
    /// `relayhost`, e.g. `[127.0.0.1]:2525`.
    pub relayhost: Option<String>,
    pub pipes: Vec<Pipe>,
    /// `default_process_limit` (Postfix's default is 100).
    pub process_limit: Option<u32>,
    /// Extra `-o name=value` for the SMTP listener (smtpd).
    pub smtpd_options: Vec<String>,
    /// Extra `main.cf` lines.
    pub main_cf: Vec<String>,
}

/// A running private Postfix.
pub struct Postfix {
    /// SMTP listener on 127.0.0.1.
    pub port: u16,
    pub dir: PathBuf,
    _tmp: tempfile::TempDir,
    running: bool,
}

impl Postfix {
    pub fn start(opts: Options) -> Postfix {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let (conf, queue, data) = (dir.join("conf"), dir.join("queue"), dir.join("data"));
        for d in [&conf, &queue, &data] {
            std::fs::create_dir_all(d).unwrap();
        }
        // Postfix's daemons run as `postfix` and open the config and map
        // files by path: the directories must be traversable.
        chmod(&dir, 0o755);
        chmod(&conf, 0o755);
        chown_postfix(&data);
        for p in &opts.pipes {
            let program = p.argv.split_whitespace().next().unwrap_or_default();
            assert_others_can_run(Path::new(program));
        }
        let port = free_port();
        let mut transport = String::new();
        for (domain, via) in &opts.transports {
            transport.push_str(&format!("{domain} {via}\n"));
        }
        std::fs::write(conf.join("transport"), transport).unwrap();
        let mut main = vec![
            "compatibility_level = 3.6".to_string(),
            format!("queue_directory = {}", queue.display()),
            format!("data_directory = {}", data.display()),
            "mail_owner = postfix".into(),
            "setgid_group = postdrop".into(),
            "myhostname = mta.mailsplit.test".into(),
            "mydomain = mailsplit.test".into(),
            "myorigin = $myhostname".into(),
            "mydestination =".into(),
            "inet_interfaces = 127.0.0.1".into(),
            "inet_protocols = ipv4".into(),
            "mynetworks = 127.0.0.0/8".into(),
            "local_recipient_maps =".into(),
            "alias_maps =".into(),
            "alias_database =".into(),
            "smtputf8_enable = no".into(),
            "biff = no".into(),
            "append_dot_mydomain = no".into(),
            "recipient_delimiter = +".into(),
            format!(
                "transport_maps = texthash:{}",
                conf.join("transport").display()
            ),
            // Logs into a file of its own (no syslog in a container).
            format!("maillog_file = {}", dir.join("maillog").display()),
            format!("maillog_file_prefixes = {}", dir.display()),
            // Retry deferred mail (a pipe that exited 75) within seconds.
            "queue_run_delay = 1s".into(),
            "minimal_backoff_time = 1s".into(),
            "maximal_backoff_time = 2s".into(),
            "smtp_connect_timeout = 5s".into(),
        ];
        if let Some(relay) = &opts.relayhost {
            main.push(format!("relayhost = {relay}"));
        }
        if let Some(n) = opts.process_limit {
            main.push(format!("default_process_limit = {n}"));
        }
        for p in &opts.pipes {
            main.push(format!(
                "{}_destination_recipient_limit = {}",
                p.name, p.recipient_limit
            ));
        }
        main.extend(opts.main_cf.iter().cloned());
        std::fs::write(conf.join("main.cf"), main.join("\n") + "\n").unwrap();

        let smtpd_options: String = opts
            .smtpd_options
            .iter()
            .map(|o| format!("\n  -o {o}"))
            .collect();
        let mut master = format!(
            "127.0.0.1:{port} inet n - n - - smtpd{smtpd_options}\n{}",
            MASTER_CF
        );
        for p in &opts.pipes {
            master.push_str(&format!(
                "{} unix - n n - {} pipe\n  flags={} user={} argv={}\n",
                p.name, p.max_processes, p.flags, p.user, p.argv
            ));
        }
        std::fs::write(conf.join("master.cf"), master).unwrap();
        let mut pf = Postfix {
            port,
            dir,
            _tmp: tmp,
            running: false,
        };
        pf.postfix(&["check"]);
        pf.postfix(&["start"]);
        pf.running = true;
        wait_port(port);
        pf
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("conf")
    }

    /// Run `postfix -c CONF ARGS`, insisting on success.
    fn postfix(&self, args: &[&str]) {
        let out = Command::new("/usr/sbin/postfix")
            .arg("-c")
            .arg(self.conf())
            .args(args)
            .output()
            .expect("postfix is not installed: run scripts/install-deps.sh");
        assert!(
            out.status.success(),
            "postfix {args:?} failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    pub fn smtp_url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Everything the instance logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("maillog")).unwrap_or_default()
    }

    /// Wait until the log has `count` lines containing `needle`.
    pub fn wait_log(&self, secs: u64, needle: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let log = self.log();
            if log.lines().filter(|l| l.contains(needle)).count() >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {count} × {needle:?} in the Postfix log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until the log has `count` lines containing every one of
    /// `needles`, asking Postfix to retry its deferred mail (`postqueue -f`)
    /// every 2 s meanwhile: qmgr's own retry schedule (backoff, a
    /// destination throttled after a failure) is Postfix's business, not
    /// what a test of ours waits on.
    pub fn wait_log_flushing(&self, secs: u64, needles: &[&str], count: usize) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let log = self.log();
            let found = log
                .lines()
                .filter(|l| needles.iter().all(|n| l.contains(n)))
                .count();
            if found >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {count} lines with {needles:?} in the Postfix log:\n{log}"
            );
            self.flush();
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    /// Messages in the queue (deferred or active), by `postqueue -j`.
    pub fn queued(&self) -> usize {
        let out = Command::new("/usr/sbin/postqueue")
            .arg("-c")
            .arg(self.conf())
            .arg("-j")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    /// Try every deferred message now (`postqueue -f`).
    pub fn flush(&self) {
        let _ = Command::new("/usr/sbin/postqueue")
            .arg("-c")
            .arg(self.conf())
            .arg("-f")
            .output();
    }

    /// Stop the instance (also done on drop).
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        let _ = Command::new("/usr/sbin/postfix")
            .arg("-c")
            .arg(self.conf())
            .arg("stop")
            .output();
        // `postfix stop` asks the master to go; make sure it went.
        let pid_file = self.dir.join("queue/pid/master.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        self.stop();
    }
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// pipe(8) runs its command as another user (`nobody`): the program and
/// every directory above it must be open to others, or each delivery is
/// deferred with "Permission denied" and the test would only time out.
/// A `target/` built under umask 077 (scripts/quickstart.sh once did) is not.
fn assert_others_can_run(program: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let program = program
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    for (path, need) in std::iter::once((program.as_path(), 0o005))
        .chain(program.ancestors().skip(1).map(|dir| (dir, 0o001)))
    {
        let mode = std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode();
        assert!(
            mode & need == need,
            "{} is mode {:o}: Postfix's pipe user cannot run {} (build under umask 022, \
             or chmod go+rx the build output)",
            path.display(),
            mode & 0o7777,
            program.display()
        );
    }
}

fn chown_postfix(path: &Path) {
    let ok = Command::new("chown")
        .arg("postfix")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "cannot chown {} to postfix (run as root)",
        path.display()
    );
}

/// Let the user a pipe runs as (e.g. `nobody`) write a SQLite database:
/// the file, its WAL and shared-memory files and its directory.
pub fn share_sqlite(url: &str) {
    let path = PathBuf::from(url.trim_start_matches("sqlite://"));
    if let Some(dir) = path.parent() {
        chmod(dir, 0o777);
    }
    for suffix in ["", "-wal", "-shm"] {
        let f = PathBuf::from(format!("{}{suffix}", path.display()));
        if f.exists() {
            chmod(&f, 0o666);
        }
    }
}

/// The services every instance runs, none chrooted (Debian's default
/// master.cf chroots most, which needs a populated queue directory).
const MASTER_CF: &str = "\
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
";

/// The shared bounce and complaint fixtures (`MANIFEST.tsv` and 43 real
/// messages): `MAILSPLIT_BOUNCE_FIXTURES`, else `../shared/fixtures/bounces`
/// beside the repository, else `/work/shared/fixtures/bounces`.
pub fn bounce_fixtures() -> PathBuf {
    let candidates = [
        std::env::var("MAILSPLIT_BOUNCE_FIXTURES")
            .ok()
            .map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/bounces")),
        Some(PathBuf::from("/work/shared/fixtures/bounces")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.join("MANIFEST.tsv").is_file())
        .expect("bounce fixtures not found: set MAILSPLIT_BOUNCE_FIXTURES to the folder with MANIFEST.tsv")
}

/// A delivery status notification as Postfix writes it: to `envelope_to`
/// (the VERP address), reporting `final_rcpt` with `status`.
pub fn postfix_dsn(
    envelope_to: &str,
    final_rcpt: &str,
    status: &str,
    diagnostic: &str,
    message_id: &str,
) -> String {
    let action = if status.starts_with('4') && diagnostic.contains("delayed") {
        "delayed"
    } else {
        "failed"
    };
    format!(
        "Return-Path: <MAILER-DAEMON>\r\n\
Date: Mon, 23 Nov 2026 12:37:38 +0000 (UTC)\r\n\
From: Mail Delivery System <MAILER-DAEMON@mta.mailsplit.test>\r\n\
Subject: Undelivered Mail Returned to Sender\r\n\
To: {envelope_to}\r\n\
Auto-Submitted: auto-replied\r\n\
MIME-Version: 1.0\r\n\
Content-Type: multipart/report; report-type=delivery-status;\r\n\
\tboundary=\"B1/mta.mailsplit.test\"\r\n\
Message-Id: <{unique}@mta.mailsplit.test>\r\n\
\r\n\
This is a MIME-encapsulated message.\r\n\
\r\n\
--B1/mta.mailsplit.test\r\n\
Content-Description: Notification\r\n\
Content-Type: text/plain; charset=us-ascii\r\n\
\r\n\
<{final_rcpt}>: host 127.0.0.1 said: {diagnostic}\r\n\
\r\n\
--B1/mta.mailsplit.test\r\n\
Content-Description: Delivery report\r\n\
Content-Type: message/delivery-status\r\n\
\r\n\
Reporting-MTA: dns; mta.mailsplit.test\r\n\
X-Postfix-Sender: rfc822; {envelope_to}\r\n\
\r\n\
Final-Recipient: rfc822; {final_rcpt}\r\n\
Original-Recipient: rfc822;{final_rcpt}\r\n\
Action: {action}\r\n\
Status: {status}\r\n\
Diagnostic-Code: smtp; {diagnostic}\r\n\
\r\n\
--B1/mta.mailsplit.test\r\n\
Content-Description: Undelivered Message Headers\r\n\
Content-Type: text/rfc822-headers\r\n\
\r\n\
Return-Path: <{envelope_to}>\r\n\
From: news@example.test\r\n\
To: {final_rcpt}\r\n\
Subject: Hello\r\n\
Message-ID: {message_id}\r\n\
\r\n\
--B1/mta.mailsplit.test--\r\n",
        unique = free_port(),
    )
}
