//! The deploy story under a real supervisord, with the repository's own
//! `scripts/supervisord.conf`: replace the binary mid-campaign, the workers
//! exit 0, supervisord starts them on the new binary, and the campaign
//! completes with nothing lost or doubled.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::*;

/// supervisord in the foreground; stopped politely (so it stops its
/// workers) when dropped.
struct Supervisor(Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        signal(&self.0, "TERM");
        let _ = wait_exit(&mut self.0, 60);
    }
}

fn worker_starts(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mailsplit-worker")
        })
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .matches("worker started")
                .count()
        })
        .sum()
}

/// The repository's `scripts/supervisord.conf` running `workers` copies of
/// a private copy of the binary (`RUN/bin/mailsplit`) with `concurrency`
/// sessions each, for `env`. Returns supervisord and the binary's path.
fn supervise(
    env: &Env,
    run: &std::path::Path,
    workers: u32,
    concurrency: u32,
) -> (Supervisor, std::path::PathBuf) {
    std::fs::create_dir_all(run.join("bin")).unwrap();
    let bin = run.join("bin/mailsplit");
    std::fs::copy(BIN, &bin).unwrap();
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/supervisord.conf");
    let sup = Supervisor(
        Command::new("supervisord")
            .args(["-n", "-c", conf])
            .env("MAILSPLIT_BIN", &bin)
            .env("MAILSPLIT_WORKERS", workers.to_string())
            .env("MAILSPLIT_DIR", run)
            .env("DATABASE_URL", &env.db.url)
            .env("BEANSTALKD", &env.beanstalkd)
            .env("MAILSPLIT_TUBE", &env.tube)
            .env("SMTP_URL", &env.smtp)
            .env("MAILSPLIT_CONCURRENCY", concurrency.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("supervisord is not installed: run scripts/install-deps.sh"),
    );
    (sup, bin)
}

#[test]
fn deploy_under_supervisord_completes_the_campaign() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(40),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    env.campaign("news", 3_000);

    let run = tmp.path().join("run");
    let (_sup, bin) = supervise(&env, &run, 2, 10);
    let sent = || env.status("news")["sent"].as_i64().unwrap();
    wait_for(60, "both workers to start", || worker_starts(&run) >= 2);
    wait_for(60, "some mail to go out", || sent() >= 300);

    // A deploy: the new binary is renamed over the old one.
    let staged = run.join("bin/mailsplit.new");
    std::fs::copy(BIN, &staged).unwrap();
    std::fs::rename(&staged, &bin).unwrap();

    wait_for(60, "supervisord to restart both workers", || {
        worker_starts(&run) >= 4
    });
    assert!(
        sent() < 3_000,
        "the campaign finished before the deploy; slow the peer down"
    );
    wait_done(&env, "news", 180);
    assert_eq!(peer.total(), 3_000);
    assert_eq!(peer.duplicates(), 0);
    let logs: String = std::fs::read_dir(&run)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mailsplit-worker")
        })
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert_eq!(logs.matches("executable replaced").count(), 2, "{logs}");
}

/// `mailsplit serve` as the repository's supervisord.conf runs it: started
/// on demand, answers a one-click unsubscribe, stops gracefully on TERM.
#[test]
fn serve_runs_under_supervisord() {
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.import_n("news", 2);
    let (public, admin) = (free_port(), free_port());
    env.create_campaign(
        "news",
        "news",
        &["--public-url", &format!("http://127.0.0.1:{public}")],
    );
    let message = env.ok(&[
        "preview",
        "news",
        "--recipient",
        "user1@example.test",
        "--real-links",
    ]);
    let link = header(&message, "List-Unsubscribe")[0]
        .trim_matches(['<', '>'])
        .to_string();

    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/supervisord.conf");
    let vars = [
        ("MAILSPLIT_BIN", BIN.to_string()),
        ("MAILSPLIT_WORKERS", "1".into()),
        ("MAILSPLIT_DIR", run.display().to_string()),
        ("DATABASE_URL", env.db.url.clone()),
        ("BEANSTALKD", env.beanstalkd.clone()),
        ("MAILSPLIT_TUBE", env.tube.clone()),
        ("MAILSPLIT_LISTEN", format!("127.0.0.1:{public}")),
        ("MAILSPLIT_ADMIN_LISTEN", format!("127.0.0.1:{admin}")),
    ];
    let _sup = Supervisor(
        Command::new("supervisord")
            .args(["-n", "-c", conf])
            .envs(vars.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("supervisord is not installed: run scripts/install-deps.sh"),
    );
    let ctl = |action: &str| {
        let mut out = None;
        // supervisord may not have opened its socket yet.
        wait_for(20, "supervisorctl to answer", || {
            let o = Command::new("supervisorctl")
                .args(["-c", conf, action, "mailsplit-serve"])
                .envs(vars.iter().cloned())
                .output()
                .unwrap();
            let done = String::from_utf8_lossy(&o.stdout).contains("mailsplit-serve");
            out = Some(o);
            done
        });
        out.unwrap()
    };
    ctl("start");
    wait_port(public);
    let r = ureq::post(&link)
        .send_form(&[("List-Unsubscribe", "One-Click")])
        .unwrap();
    assert_eq!(r.status(), 200);
    let out = env.run(&["preview", "news", "--recipient", "user1@example.test"]);
    assert!(stderr(&out).contains("unsubscribed"), "{}", stderr(&out));
    ctl("stop");
    let log = std::fs::read_to_string(run.join("mailsplit-serve.log")).unwrap();
    assert!(log.contains("serve stopped"), "{log}");
}

/// A deploy as `mailsplit workers` shows it: every old-binary worker says
/// it is stopping and leaves, new-binary workers arrive, and it ends with
/// all of them on the new binary, none lost, the campaign complete.
#[test]
fn a_deploy_shows_in_the_fleet_until_all_run_the_new_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        // 4,000 messages over 15 sessions: about 55 s, longer than a
        // deploy of three workers each hashing a debug binary of some
        // 370 MB under load.
        data_delay: Duration::from_millis(200),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    env.campaign("news", 4_000);

    let run = tmp.path().join("run");
    let (_sup, bin) = supervise(&env, &run, 3, 5);
    let alive = |rows: &[serde_json::Value], binary: &str| {
        rows.iter()
            .filter(|w| w["binary"] == binary && w["state"] != "lost")
            .count()
    };
    wait_for(60, "three workers to report", || {
        let rows = env.workers();
        rows.len() == 3 && rows.iter().all(|w| w["sent"].as_i64().unwrap() > 0)
    });
    let before = env.workers();
    let old = before[0]["binary"].as_str().unwrap().to_string();
    assert_eq!(alive(&before, &old), 3, "{before:?}");
    let old_pids: Vec<_> = before.iter().map(|w| w["pid"].clone()).collect();

    // The deploy: a new build (here: the same program with other bytes)
    // renamed over the old file.
    let staged = run.join("bin/mailsplit.new");
    let mut new_binary = std::fs::read(BIN).unwrap();
    new_binary.extend_from_slice(b"\0mailsplit test build 2\n");
    std::fs::write(&staged, &new_binary).unwrap();
    std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let new: String = <sha2::Sha256 as sha2::Digest>::digest(&new_binary)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_ne!(new, old);
    std::fs::rename(&staged, &bin).unwrap();

    // Watch it happen: (old alive, new alive, old stopping) per look.
    let mut seen: Vec<(usize, usize, usize)> = Vec::new();
    wait_for(120, "every worker on the new binary", || {
        let rows = env.workers();
        let stopping = rows
            .iter()
            .filter(|w| w["binary"] == old.as_str() && w["state"] == "stopping")
            .count();
        let look = (alive(&rows, &old), alive(&rows, &new), stopping);
        if seen.last() != Some(&look) {
            seen.push(look);
        }
        look.0 == 0 && look.1 == 3
    });
    eprintln!("(old alive, new alive, old stopping) during the deploy: {seen:?}");
    assert!(
        seen.iter().any(|&(_, _, stopping)| stopping > 0),
        "old workers said they were stopping: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|&(o, n, _)| (o, n) != (3, 0) && (o, n) != (0, 3)),
        "a moment with workers leaving or arriving: {seen:?}"
    );
    for pair in seen.windows(2) {
        assert!(pair[1].0 <= pair[0].0, "an old worker came back: {seen:?}");
        assert!(pair[1].1 >= pair[0].1, "a new worker went away: {seen:?}");
    }
    let after = env.workers();
    assert!(after
        .iter()
        .all(|w| w["newest"] == true && w["state"] == "running"));
    assert!(after.iter().all(|w| !old_pids.contains(&w["pid"])));
    let text = env.ok(&["workers"]);
    assert!(
        text.contains(&format!("3 of 3 alive on the newest binary {new}")),
        "{text}"
    );
    assert!(
        env.status("news")["pending"].as_i64().unwrap() > 0,
        "the campaign finished before the deploy was over; slow the peer down"
    );
    wait_done(&env, "news", 180);
    assert_eq!(peer.total(), 4_000);
    assert_eq!(peer.duplicates(), 0);
}
