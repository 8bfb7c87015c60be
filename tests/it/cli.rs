//! The command line as a user drives it: the built binary against a real
//! beanstalkd (with a binlog), SQLite and PostgreSQL. Import reporting and
//! upserts, usage errors and exit codes (0 ok, 1 runtime failure, 2 usage),
//! the exact job format, and crash-safe enqueue: killed mid-way, beanstalkd
//! down or killed mid-way, several servers — every recipient lands in
//! exactly one job.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;
use mailsplit::store::recipients::{self, Recipient};

// ---------------------------------------------------------------- helpers

/// A beanstalkd with a binlog, and an environment pointing at it.
fn setup(kind: Kind) -> (tempfile::TempDir, Beanstalkd, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    (tmp, bs, env)
}

fn create(env: &Env, name: &str, list: &str, extra: &[&str]) -> Output {
    env.try_create_campaign(name, list, extra)
}

fn create_ok(env: &Env, name: &str, list: &str, extra: &[&str]) -> String {
    env.create_campaign(name, list, extra)
}

/// Assert the exit code and that stderr carries the one-line
/// `mailsplit: error: …` cause chain; returns that line.
fn fails(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}\nstdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("mailsplit: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected in:\n{err}");
    lines[0].to_string()
}

/// The members of a list, with name, attributes and status, by email.
fn members(env: &Env, list: &str) -> BTreeMap<String, Recipient> {
    let ids = member_ids(env, list);
    recipients::load(&mut env.conn(), &ids)
        .unwrap()
        .into_iter()
        .map(|r| (r.email.clone(), r))
        .collect()
}

/// One job as found in the tube.
#[derive(Debug)]
struct Job {
    pri: u32,
    campaign: i64,
    ids: Vec<i64>,
}

/// Parse a body, insisting on the exact documented encoding:
/// `{"v":2,"db":"db-…","campaign":<id>,"recipients":[<id>,…],"mac":"…"}`,
/// nothing else.
fn parse_job(pri: u32, body: &str) -> Job {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("body {body:?}: {e}"));
    let obj = v.as_object().unwrap();
    let keys: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["v", "db", "campaign", "recipients", "mac"]),
        "{body}"
    );
    assert_eq!(obj["v"], 2, "{body}");
    let db = obj["db"].as_str().unwrap();
    let mac = obj["mac"].as_str().unwrap();
    let campaign = obj["campaign"].as_i64().unwrap();
    let ids: Vec<i64> = obj["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    let joined: Vec<String> = ids.iter().map(i64::to_string).collect();
    assert_eq!(
        body,
        format!(
            r#"{{"v":2,"db":"{db}","campaign":{campaign},"recipients":[{}],"mac":"{mac}"}}"#,
            joined.join(",")
        ),
        "body is not in the exact job format"
    );
    Job { pri, campaign, ids }
}

/// Take every ready job out of the tube.
fn drain_jobs(bs: &Beanstalkd, tube: &str) -> Vec<Job> {
    bs.drain(tube)
        .into_iter()
        .map(|(pri, body)| parse_job(pri, &body))
        .collect()
}

/// Every job is for `campaign`, has at most `max` ids, and together the
/// jobs name each id of `all` exactly once.
fn assert_each_once(jobs: &[Job], campaign: i64, max: usize, all: &[i64]) {
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for job in jobs {
        assert_eq!(job.campaign, campaign);
        assert!(!job.ids.is_empty() && job.ids.len() <= max, "{job:?}");
        for &id in &job.ids {
            *seen.entry(id).or_default() += 1;
        }
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).take(10).collect();
    assert!(
        doubled.is_empty(),
        "recipients in several jobs: {doubled:?}"
    );
    let expected: BTreeSet<i64> = all.iter().copied().collect();
    let got: BTreeSet<i64> = seen.keys().copied().collect();
    let missing: Vec<_> = expected.difference(&got).take(10).collect();
    let extra: Vec<_> = got.difference(&expected).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, unexpected {extra:?}"
    );
}

/// One `stats-tube` counter over an existing connection.
fn stat(c: &mut beanstalkc::Beanstalkc, tube: &str, key: &str) -> u64 {
    match c.stats_tube(tube) {
        Ok(m) => m.get(key).and_then(|v| v.parse().ok()).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Jobs ever created on a server (`stats` `total-jobs`).
fn server_total_jobs(bs: &Beanstalkd) -> u64 {
    bs.client().stats().unwrap()["total-jobs"].parse().unwrap()
}

/// Start `enqueue NAME` in the background and wait until at least `at`
/// jobs are ready in the tube (so it is certainly mid-way). Returns the
/// child, or `None` when it finished before getting there.
fn enqueue_until(env: &Env, bs: &Beanstalkd, name: &str, at: u64) -> Option<std::process::Child> {
    let mut child = env
        .cmd(&["enqueue", name])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = bs.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        if stat(&mut c, &env.tube, "current-jobs-ready") >= at {
            return Some(child);
        }
        assert!(
            Instant::now() < deadline,
            "enqueue {name} never reached {at} jobs"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn child_stderr(child: &mut std::process::Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut s).unwrap();
    }
    s
}

/// SIGKILL `enqueue NAME` `after` the moment `at` jobs are ready. Returns
/// the ready count afterwards and the run's stderr, or `None` when the run
/// completed on its own first.
fn kill_enqueue_at(
    env: &Env,
    bs: &Beanstalkd,
    name: &str,
    at: u64,
    after: Duration,
) -> Option<(u64, String)> {
    let mut child = enqueue_until(env, bs, name, at)?;
    std::thread::sleep(after);
    child.kill().unwrap();
    let status = child.wait().unwrap();
    let err = child_stderr(&mut child);
    if status.success() {
        return None;
    }
    Some((bs.tube_stat(&env.tube, "current-jobs-ready"), err))
}

/// Jobs an enqueue run puts per database step (one page of the list): what
/// a killed run may leave in the queue unconfirmed.
const WINDOW_JOBS: u64 = mailsplit::enqueue::PAGE_SIZE as u64 / 100;

/// After an interrupted run, the counters hold exactly the confirmed puts:
/// the tube has those jobs plus at most one window of unconfirmed ones.
fn assert_counters_behind_queue(env: &Env, name: &str, ready: u64) {
    let s = env.status(name);
    assert_eq!(s["state"], "enqueuing", "{s}");
    let jobs = s["jobs"].as_u64().unwrap();
    assert!(
        (jobs..=jobs + WINDOW_JOBS).contains(&ready),
        "{ready} jobs ready but {jobs} confirmed: {s}"
    );
    assert_eq!(s["enqueued"].as_u64().unwrap(), jobs * 100, "{s}");
}

/// Write `text` (with `\n` line ends) to `path`, optionally as CRLF.
fn write_lines(path: &Path, text: &[u8], crlf: bool) {
    let bytes = if crlf {
        let mut v = Vec::new();
        for &b in text {
            if b == b'\n' {
                v.push(b'\r');
            }
            v.push(b);
        }
        v
    } else {
        text.to_vec()
    };
    std::fs::write(path, bytes).unwrap();
}

/// `path: line N: reason` lines of an import's stderr, as (N, reason).
fn rejected(err: &str, path: &Path) -> Vec<(u64, String)> {
    let prefix = format!("{}: line ", path.display());
    err.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (n, reason) = rest.split_once(": ").unwrap();
            (n.parse().unwrap(), reason.to_string())
        })
        .collect()
}

fn import(env: &Env, path: &Path, list: &str) -> Output {
    env.run(&["import", path.to_str().unwrap(), "--list", list])
}

// ---------------------------------------------------------------- import

/// Good rows mixed with one of each kind of bad row. Line numbers (1-based,
/// header is line 1) are in the comments.
const MIXED_CSV: &[u8] = b"email,name,city,plan
good1@example.test,Good One,Paris,gold
not-an-address,Bad,Rome,x
good2@example.test,Two,Oslo,x,extra
\"nl@example.test\",\"Two
Lines\",Bern,x
good3@example.test,\xff\xfe,Lima,x
good4@example.test,Four,\xc3(,x
GOOD5@Example.TEST,\"Five, Jr.\",Kyiv,silver
good6@example.test,Six,\"Multi
Line City\",bronze
bad-after-multiline,X,Y,z
";
// line 2: good1; 3: bad address; 4: five fields; 5-6: newline in the name;
// 7: invalid UTF-8 name; 8: invalid UTF-8 attribute; 9: good5;
// 10-11: good6 (newline inside an attribute is fine); 12: bad address.

fn import_reports_bad_rows(crlf: bool) {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.ok(&["migrate"]);
    let path = env.dir.path().join("mixed.csv");
    write_lines(&path, MIXED_CSV, crlf);

    let out = import(&env, &path, "people");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let bad = rejected(&err, &path);
    let lines: Vec<u64> = bad.iter().map(|(n, _)| *n).collect();
    assert_eq!(lines, [3, 4, 5, 7, 8, 12], "stderr:\n{err}");
    let reasons: Vec<&str> = bad.iter().map(|(_, r)| r.as_str()).collect();
    assert!(
        reasons[0].contains("invalid email \"not-an-address\""),
        "{err}"
    );
    assert!(
        reasons[1].contains("has 5 fields, the header has 4"),
        "{err}"
    );
    assert!(
        reasons[2].contains("name contains control characters"),
        "{err}"
    );
    assert!(
        reasons[3].contains("column \"name\" is not valid UTF-8"),
        "{err}"
    );
    assert!(
        reasons[4].contains("column \"city\" is not valid UTF-8"),
        "{err}"
    );
    assert!(
        reasons[5].contains("invalid email \"bad-after-multiline\""),
        "{err}"
    );
    let summary = stdout(&out);
    assert!(
        summary.contains("added 3 / updated 0 / unchanged 0 / skipped 6"),
        "{summary}"
    );

    // Exactly the good rows are in, whole; extra columns are attributes.
    let people = members(&env, "people");
    let emails: Vec<&str> = people.keys().map(String::as_str).collect();
    assert_eq!(
        emails,
        [
            "GOOD5@example.test",
            "good1@example.test",
            "good6@example.test"
        ]
    );
    let good1 = &people["good1@example.test"];
    assert_eq!(good1.name, "Good One");
    assert_eq!(good1.status.as_str(), "active");
    let attrs: serde_json::Value = serde_json::from_str(&good1.attributes).unwrap();
    assert_eq!(attrs, serde_json::json!({"city": "Paris", "plan": "gold"}));
    let good5 = &people["GOOD5@example.test"];
    assert_eq!(good5.name, "Five, Jr.");
    let attrs: serde_json::Value = serde_json::from_str(&good5.attributes).unwrap();
    assert_eq!(attrs, serde_json::json!({"city": "Kyiv", "plan": "silver"}));
    let attrs: serde_json::Value =
        serde_json::from_str(&people["good6@example.test"].attributes).unwrap();
    let city = attrs["city"].as_str().unwrap();
    assert!(city.starts_with("Multi") && city.ends_with("Line City") && city.contains('\n'));
    assert_eq!(attrs["plan"], "bronze");

    let first = create_ok(&env, "first", "people", &[]);
    assert!(first.contains(": 3 recipients"), "{first}");

    // Importing again updates, reports the same bad rows, and never
    // duplicates a recipient or a list membership.
    let again = import(&env, &path, "people");
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("added 0 / updated 0 / unchanged 3 / skipped 6"),
        "{}",
        stdout(&again)
    );
    let lines: Vec<u64> = rejected(&stderr(&again), &path)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(lines, [3, 4, 5, 7, 8, 12]);
    let second = create_ok(&env, "second", "people", &[]);
    assert!(second.contains(": 3 recipients"), "{second}");
    assert_eq!(env.status("second")["recipients"], 3);
    assert_eq!(member_ids(&env, "people").len(), 3);
}

#[test]
fn import_reports_bad_rows_with_line_numbers() {
    import_reports_bad_rows(false);
}

#[test]
fn import_reports_bad_rows_with_line_numbers_crlf() {
    import_reports_bad_rows(true);
}

/// The csv reader silently skips empty lines, and `import_reader` counts
/// lines itself from the records it gets, so every blank line before a bad
/// row shifts the reported line number down by one.
#[test]

fn import_line_numbers_count_blank_lines() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.ok(&["migrate"]);
    let path = env.dir.path().join("blank.csv");
    // 1 header, 2 blank, 3 good, 4 blank, 5 bad.
    write_lines(&path, b"email,name\n\na@example.test,A\n\nbad,B\n", false);
    let out = import(&env, &path, "blank");
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("added 1 / updated 0 / unchanged 0 / skipped 1"));
    let lines: Vec<u64> = rejected(&stderr(&out), &path)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(lines, [5], "stderr:\n{}", stderr(&out));
}

#[test]
fn import_missing_file_is_a_runtime_error_naming_the_path() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.ok(&["migrate"]);
    let path = env.dir.path().join("no-such-file.csv");
    let err = fails(&import(&env, &path, "x"), 1);
    assert!(err.contains(&path.display().to_string()), "{err}");
}

#[test]
fn import_without_email_column_names_the_column() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.ok(&["migrate"]);
    let path = env.dir.path().join("noemail.csv");
    write_lines(&path, b"mail,name\na@example.test,A\n", false);
    let err = fails(&import(&env, &path, "x"), 2);
    assert!(err.contains("`email`"), "{err}");
    assert!(err.contains("found: mail, name"), "{err}");
    // Nothing was written.
    assert!(recipients::find_list(&mut env.conn(), "x").is_err());
}

#[test]
fn unsubscribed_recipients_are_skipped_at_enqueue() {
    let (_tmp, bs, env) = setup(Kind::Sqlite);
    env.ok(&["migrate"]);
    let path = env.dir.path().join("status.csv");
    write_lines(
        &path,
        b"email,name,status\n\
          a@example.test,A,active\n\
          b@example.test,B,unsubscribed\n\
          c@example.test,C,\n\
          d@example.test,D,maybe\n\
          e@example.test,E,Bounced\n",
        false,
    );
    let out = import(&env, &path, "s");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).contains("added 4 / updated 0 / unchanged 0 / skipped 1"),
        "{}",
        stdout(&out)
    );
    let bad = rejected(&stderr(&out), &path);
    assert_eq!(bad.len(), 1, "{}", stderr(&out));
    assert_eq!(bad[0].0, 5);
    assert!(bad[0].1.contains("maybe"), "{:?}", bad[0]);
    let people = members(&env, "s");
    assert_eq!(people["a@example.test"].status.as_str(), "active");
    assert_eq!(people["b@example.test"].status.as_str(), "unsubscribed");
    assert_eq!(people["c@example.test"].status.as_str(), "active");
    assert_eq!(people["e@example.test"].status.as_str(), "bounced");

    create_ok(&env, "s", "s", &[]);
    env.ok(&["enqueue", "s"]);
    let s = env.status("s");
    assert_eq!(
        (
            &s["recipients"],
            &s["enqueued"],
            &s["skipped"],
            &s["pending"]
        ),
        (
            &serde_json::json!(4),
            &serde_json::json!(2),
            &serde_json::json!(2),
            &serde_json::json!(2)
        ),
        "{s}"
    );
    let jobs = drain_jobs(&bs, &env.tube);
    let want = vec![people["a@example.test"].id, people["c@example.test"].id];
    assert_each_once(&jobs, s["id"].as_i64().unwrap(), 100, &want);
}

/// `enqueue` prints "(N skipped as not active)", but `Report::skipped` only
/// counts the not-active recipients after the last put; those that went
/// into a put's `Confirm` are recorded in the ledger and counters but never
/// added to the report.
#[test]

fn enqueue_reports_every_skipped_recipient() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.ok(&["migrate"]);
    let path = env.dir.path().join("status.csv");
    write_lines(
        &path,
        b"email,status\n\
          a@example.test,active\n\
          b@example.test,unsubscribed\n\
          c@example.test,active\n",
        false,
    );
    env.ok(&["import", path.to_str().unwrap(), "--list", "s"]);
    create_ok(&env, "s", "s", &[]);
    let out = env.ok(&["enqueue", "s"]);
    assert_eq!(env.status("s")["skipped"], 1);
    assert!(
        out.contains("enqueued 2 recipients in 1 jobs (1 skipped as not active)"),
        "{out}"
    );
}

// ---------------------------------------------------------------- database

#[test]
fn unsupported_database_url_is_a_usage_error() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    for args in [&["migrate"][..], &["status"], &["campaign", "list"]] {
        let out = env
            .cmd(args)
            .env("DATABASE_URL", "mysql://x")
            .output()
            .unwrap();
        let err = fails(&out, 2);
        assert!(err.contains("mysql://x"), "{err}");
        assert!(
            err.contains("sqlite://") && err.contains("postgres://"),
            "{err}"
        );
    }
    let out = env
        .cmd(&["status", "--database-url", "mysql://x"])
        .output()
        .unwrap();
    fails(&out, 2);
}

fn unmigrated_database_says_run_migrate(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let _bs = Beanstalkd::start(tmp.path());
    let env = Env::empty(kind, &_bs.addr());
    let csv = env.dir.path().join("a.csv");
    write_csv(&csv, 3);
    let commands: [&[&str]; 6] = [
        &["status"],
        &["campaign", "list"],
        &["import", csv.to_str().unwrap(), "--list", "a"],
        &["enqueue", "x"],
        &["pause", "x"],
        &["status", "x", "--json"],
    ];
    for args in commands {
        let err = fails(&env.run(args), 1);
        assert!(err.contains("run `mailsplit migrate`"), "{args:?}: {err}");
    }
    let first = env.ok(&["migrate"]);
    assert!(first.contains("applied"), "{first}");
    assert!(env.ok(&["migrate"]).contains("up to date"));
    assert!(env.ok(&["campaign", "list"]).contains("no campaigns yet"));
}

// ---------------------------------------------------------------- campaigns

#[test]
fn campaign_create_rejects_bad_arguments() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.import_n("customers", 5);
    env.import_n("staff", 2);

    let err = fails(&create(&env, "c", "nobody", &[]), 2);
    assert!(err.contains("unknown list \"nobody\""), "{err}");
    assert!(err.contains("customers, staff"), "{err}");

    let templates: Vec<String> = env.ok(&["templates"]).lines().map(str::to_string).collect();
    assert!(
        templates.contains(&"newsletter".to_string()),
        "{templates:?}"
    );
    let mut args = vec!["campaign", "create", "c", "--list", "customers"];
    args.extend(["--template", "nope", "--subject", "S", "--from", "a@b.test"]);
    let err = fails(&env.run(&args), 2);
    assert!(err.contains("unknown template \"nope\""), "{err}");
    for t in &templates {
        assert!(err.contains(t.as_str()), "{t} not listed: {err}");
    }

    for from in ["not an address", "a@b.test\r\nBcc: x@y.test", ""] {
        let args = [
            "campaign",
            "create",
            "c",
            "--list",
            "customers",
            "--template",
            "newsletter",
            "--subject",
            "S",
            "--from",
            from,
        ];
        let err = fails(&env.run(&args), 2);
        assert!(err.contains("bad sender address"), "{from:?}: {err}");
    }
    let args = [
        "campaign",
        "create",
        "c",
        "--list",
        "customers",
        "--template",
        "newsletter",
        "--subject",
        "two\nlines",
        "--from",
        "a@b.test",
    ];
    fails(&env.run(&args), 2);

    // None of that created anything.
    assert!(env.ok(&["campaign", "list"]).contains("no campaigns yet"));

    let out = create_ok(&env, "c", "customers", &["--priority", "7"]);
    assert!(
        out.contains("5 recipients") && out.contains("priority 7"),
        "{out}"
    );
    let err = fails(&create(&env, "c", "staff", &[]), 2);
    assert!(err.contains("campaign \"c\" already exists"), "{err}");

    create_ok(&env, "d", "staff", &[]);
    let list = env.ok(&["campaign", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(
        lines[0].contains(" c ") && lines[0].contains("5 recipients"),
        "{list}"
    );
    assert!(
        lines[1].contains(" d ") && lines[1].contains("2 recipients"),
        "{list}"
    );
    assert!(lines.iter().all(|l| l.contains("draft")), "{list}");
}

#[test]
fn unknown_campaign_is_a_usage_error() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.import_n("l", 3);
    create_ok(&env, "known", "l", &[]);
    for cmd in ["enqueue", "status", "pause", "resume", "cancel", "preview"] {
        let err = fails(&env.run(&[cmd, "ghost"]), 2);
        assert!(err.contains("unknown campaign \"ghost\""), "{cmd}: {err}");
    }
    // By id works; an id nobody has does not.
    let id = env.status("known")["id"].as_i64().unwrap();
    assert_eq!(env.status(&id.to_string())["name"], "known");
    fails(&env.run(&["status", &(id + 100).to_string()]), 2);
}

#[test]
fn bad_enqueue_options_are_usage_errors() {
    let (_tmp, _bs, env) = setup(Kind::Sqlite);
    env.import_n("l", 3);
    create_ok(&env, "c", "l", &[]);
    let err = fails(&env.run(&["enqueue", "c", "--batch-size", "0"]), 2);
    assert!(err.contains("--batch-size"), "{err}");
    fails(&env.run(&["enqueue", "c", "--batch-size", "1001"]), 2);
    let err = fails(&env.run(&["enqueue", "c", "--beanstalkd", "nohost"]), 2);
    assert!(err.contains("nohost"), "{err}");
    fails(&env.run(&["enqueue", "c", "--tube=-bad"]), 2);
    // None of that touched the campaign.
    assert_eq!(env.status("c")["state"], "draft");
}

#[test]
fn pause_resume_cancel_change_the_state() {
    let (_tmp, bs, env) = setup(Kind::Sqlite);
    env.campaign("news", 10);
    let state = || env.status("news")["state"].as_str().unwrap().to_string();
    assert_eq!(state(), "sending");

    let err = fails(&env.run(&["resume", "news"]), 2);
    assert!(err.contains("not paused"), "{err}");

    assert!(env.ok(&["pause", "news"]).contains("paused"));
    assert_eq!(state(), "paused");
    fails(&env.run(&["pause", "news"]), 2);

    assert!(env.ok(&["resume", "news"]).contains("resumed"));
    assert_eq!(state(), "sending");

    assert!(env.ok(&["cancel", "news"]).contains("cancelled"));
    assert_eq!(state(), "cancelled");
    for cmd in ["resume", "pause", "cancel", "enqueue"] {
        let err = fails(&env.run(&[cmd, "news"]), 2);
        assert!(err.contains("cancelled"), "{cmd}: {err}");
    }
    assert_eq!(state(), "cancelled");
    // Nothing was put by the refused enqueue.
    assert_eq!(drain_jobs(&bs, &env.tube).len(), 1);
}

// ---------------------------------------------------------------- enqueue

#[test]
fn enqueue_puts_exact_jobs_once() {
    let (_tmp, bs, env) = setup(Kind::Sqlite);
    env.import_n("big", 1_050);
    let all = member_ids(&env, "big");
    assert_eq!(all.len(), 1_050);
    create_ok(&env, "big", "big", &[]);
    let out = env.ok(&["enqueue", "big"]);
    assert!(out.contains("enqueued 1050 recipients in 11 jobs"), "{out}");

    let s = env.status("big");
    let id = s["id"].as_i64().unwrap();
    let priority = s["priority"].as_u64().unwrap();
    assert_eq!(
        (
            &s["state"],
            &s["recipients"],
            &s["enqueued"],
            &s["jobs"],
            &s["pending"],
            &s["sent"]
        ),
        (
            &serde_json::json!("sending"),
            &serde_json::json!(1050),
            &serde_json::json!(1050),
            &serde_json::json!(11),
            &serde_json::json!(1050),
            &serde_json::json!(0)
        ),
        "{s}"
    );
    let jobs = drain_jobs(&bs, &env.tube);
    assert_eq!(jobs.len(), 11);
    assert_each_once(&jobs, id, 100, &all);
    assert!(
        jobs.iter().all(|j| u64::from(j.pri) == priority),
        "{jobs:?}"
    );
    let mut sizes: Vec<usize> = jobs.iter().map(|j| j.ids.len()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes[0], 50);
    assert!(sizes[1..].iter().all(|&n| n == 100), "{sizes:?}");

    // Again: nothing to do, nothing put (not even a probe job).
    let before = server_total_jobs(&bs);
    let again = env.ok(&["enqueue", "big"]);
    assert!(again.contains("already fully enqueued"), "{again}");
    assert_eq!(server_total_jobs(&bs), before);
    assert_eq!(bs.tube_stat(&env.tube, "current-jobs-ready"), 0);
    assert_eq!(env.status("big")["enqueued"], 1050);

    // A second campaign on the same list: its own priority and batch size.
    create_ok(&env, "small-batches", "big", &["--priority", "5"]);
    env.ok(&["enqueue", "small-batches", "--batch-size", "50"]);
    let s = env.status("small-batches");
    assert_eq!(
        (&s["jobs"], &s["enqueued"]),
        (&21.into(), &1050.into()),
        "{s}"
    );
    let jobs = drain_jobs(&bs, &env.tube);
    assert_eq!(jobs.len(), 21);
    assert_each_once(&jobs, s["id"].as_i64().unwrap(), 50, &all);
    assert!(jobs.iter().all(|j| j.pri == 5), "{jobs:?}");
}

/// SIGKILL `enqueue` `kills` times at increasing points, then let it
/// finish: the tube must hold each recipient exactly once.
fn enqueue_resumes_after_kills(kind: Kind, kills: u64) {
    let (_tmp, bs, env) = setup(kind);
    // The killed runs' jobs wait out a lease before they are recovered.
    let env = env.short_lease(5_000);
    let started = Instant::now();
    env.import_bulk("big", 150_000);
    eprintln!("import of 150000 took {:?}", started.elapsed());
    let all = member_ids(&env, "big");
    assert_eq!(all.len(), 150_000);
    for attempt in 0..4 {
        let name = format!("big{attempt}");
        create_ok(&env, &name, "big", &[]);
        let mut ready = 0;
        let mut interrupted = 0;
        let mut outcomes = Vec::new();
        for k in 1..=kills {
            let at = (1_500 * k / (kills + 2)).max(ready + 1);
            // Vary the moment so a kill may land before or after the put.
            let after = Duration::from_micros(250 * (k - 1));
            match kill_enqueue_at(&env, &bs, &name, at, after) {
                Some((now, log)) => {
                    assert!(now >= ready && now < 1_500, "{now} jobs after kill {k}");
                    assert_counters_behind_queue(&env, &name, now);
                    if k > 1 {
                        outcomes.push(in_doubt_outcome(&log));
                    }
                    ready = now;
                    interrupted += 1;
                }
                None => break,
            }
        }
        if interrupted < kills {
            eprintln!("attempt {attempt}: enqueue finished before kill; again");
            bs.drain(&env.tube);
            continue;
        }
        let started = Instant::now();
        let run = env.run(&["enqueue", &name]);
        assert!(run.status.success(), "{}", stderr(&run));
        outcomes.push(in_doubt_outcome(&stderr(&run)));
        eprintln!(
            "final enqueue after {kills} kill(s): {:?}: {}in-doubt jobs: {outcomes:?}",
            started.elapsed(),
            stdout(&run)
        );
        let s = env.status(&name);
        assert_eq!(
            (&s["state"], &s["recipients"], &s["enqueued"], &s["jobs"]),
            (
                &"sending".into(),
                &150_000.into(),
                &150_000.into(),
                &1_500.into()
            ),
            "{s}"
        );
        let jobs = drain_jobs(&bs, &env.tube);
        assert_eq!(jobs.len(), 1_500);
        assert_each_once(&jobs, s["id"].as_i64().unwrap(), 100, &all);
        assert!(env
            .ok(&["enqueue", &name])
            .contains("already fully enqueued"));
        return;
    }
    panic!("enqueue always finished before it could be killed");
}

#[test]
fn enqueue_spreads_jobs_over_several_servers() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Beanstalkd::start(tmp.path());
    let b = Beanstalkd::start(tmp.path());
    let env = Env::new(Kind::Sqlite, &format!("{},{}", a.addr(), b.addr()));
    env.campaign("spread", 1_000);
    let all = member_ids(&env, "spread");
    let s = env.status("spread");
    let id = s["id"].as_i64().unwrap();
    assert_eq!(s["jobs"], 10, "{s}");
    let on_a = drain_jobs(&a, &env.tube);
    let on_b = drain_jobs(&b, &env.tube);
    assert_eq!((on_a.len(), on_b.len()), (5, 5));
    let both: Vec<Job> = on_a.into_iter().chain(on_b).collect();
    assert_each_once(&both, id, 100, &all);

    // The same through --beanstalkd, overriding the environment.
    create_ok(&env, "flag", "spread", &[]);
    let list = format!("{} , {}", b.addr(), a.addr());
    let out = env
        .cmd(&["enqueue", "flag", "--beanstalkd", &list])
        .env("BEANSTALKD", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let on_a = drain_jobs(&a, &env.tube);
    let on_b = drain_jobs(&b, &env.tube);
    assert_eq!((on_a.len(), on_b.len()), (5, 5));
    let both: Vec<Job> = on_a.into_iter().chain(on_b).collect();
    assert_each_once(&both, env.status("flag")["id"].as_i64().unwrap(), 100, &all);
}

#[test]
fn enqueue_with_beanstalkd_down_fails_then_completes() {
    let (_tmp, mut bs, env) = setup(Kind::Sqlite);
    env.import_n("l", 1_000);
    let all = member_ids(&env, "l");
    create_ok(&env, "c", "l", &[]);
    bs.stop();
    let err = fails(&env.run(&["enqueue", "c"]), 1);
    assert!(err.contains(&bs.addr()), "{err}");
    assert!(err.contains("beanstalkd"), "{err}");
    assert_eq!(env.status("c")["enqueued"], 0);

    bs.restart();
    let out = env.ok(&["enqueue", "c"]);
    assert!(out.contains("enqueued 1000 recipients in 10 jobs"), "{out}");
    let jobs = drain_jobs(&bs, &env.tube);
    assert_eq!(jobs.len(), 10);
    assert_each_once(&jobs, env.status("c")["id"].as_i64().unwrap(), 100, &all);
}

/// Two servers, one down: enqueue refuses to start rather than silently
/// putting everything on the other.
#[test]
fn enqueue_with_one_of_two_servers_down_fails_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Beanstalkd::start(tmp.path());
    let mut b = Beanstalkd::start(tmp.path());
    let env = Env::new(Kind::Sqlite, &format!("{},{}", a.addr(), b.addr()));
    env.import_n("l", 500);
    let all = member_ids(&env, "l");
    create_ok(&env, "c", "l", &[]);
    b.stop();
    let err = fails(&env.run(&["enqueue", "c"]), 1);
    assert!(err.contains(&b.addr()), "{err}");
    b.restart();
    env.ok(&["enqueue", "c"]);
    let both: Vec<Job> = drain_jobs(&a, &env.tube)
        .into_iter()
        .chain(drain_jobs(&b, &env.tube))
        .collect();
    assert_each_once(&both, env.status("c")["id"].as_i64().unwrap(), 100, &all);
}

/// enqueue is killed (usually with its last put unconfirmed), then
/// beanstalkd restarts from its binlog before the re-run: the in-doubt
/// search must still recognise the job by its id after the restart.
#[test]
fn enqueue_killed_then_beanstalkd_restarted() {
    let (_tmp, mut bs, env) = setup(Kind::Sqlite);
    env.import_bulk("big", 50_000);
    let all = member_ids(&env, "big");
    for attempt in 0..4 {
        let name = format!("big{attempt}");
        create_ok(&env, &name, "big", &[]);
        let Some((ready, _)) = kill_enqueue_at(&env, &bs, &name, 100, Duration::ZERO) else {
            bs.drain(&env.tube);
            continue;
        };
        assert_counters_behind_queue(&env, &name, ready);
        bs.restart();
        assert_eq!(bs.tube_stat(&env.tube, "current-jobs-ready"), ready);
        let run = env.run(&["enqueue", &name]);
        assert!(run.status.success(), "{}", stderr(&run));
        eprintln!(
            "resumed ({} in-doubt job): {}",
            in_doubt_outcome(&stderr(&run)),
            stdout(&run)
        );
        let s = env.status(&name);
        assert_eq!(
            (&s["enqueued"], &s["jobs"]),
            (&50_000.into(), &500.into()),
            "{s}"
        );
        let jobs = drain_jobs(&bs, &env.tube);
        assert_eq!(jobs.len(), 500);
        assert_each_once(&jobs, s["id"].as_i64().unwrap(), 100, &all);
        return;
    }
    panic!("enqueue always finished before it could be killed");
}

/// A run killed in the middle of a window, set up exactly through the
/// store: its intent covers the members up to a point inside the second
/// page, over two servers. Of the window it put four jobs on server a (one
/// of them already taken and finished by a worker: only in the ledger) and
/// one on server b, which the next run is not given. The next run must find
/// all of them, put only the rest, in the same jobs of 100 an uninterrupted
/// run puts, and leave the window's remainder (less than a job) to the
/// pages after it. While server b is down, it must refuse to guess.
fn an_interrupted_window_is_finished_exactly(kind: Kind) {
    use mailsplit::store::campaigns::{self, Intent};
    let tmp = tempfile::tempdir().unwrap();
    let a = Beanstalkd::start(tmp.path());
    let mut b = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &a.addr());
    env.import_bulk("l", 25_000);
    let all = member_ids(&env, "l");
    create_ok(&env, "c", "l", &[]);
    let campaign = env.status("c")["id"].as_i64().unwrap();

    // The killed run: on this machine, its process gone.
    let mut conn = env.conn();
    let dead = format!(
        "pid 4194305 on {}, run 0000002a",
        mailsplit::config::host_name()
    );
    assert_eq!(
        campaigns::take_enqueue_lease(&mut conn, campaign, &dead).unwrap(),
        None
    );
    campaigns::start_enqueue(&mut conn, campaign, 25_000).unwrap();
    let intent = Intent {
        upto: all[10_049],
        servers: vec![
            (a.addr(), server_total_jobs(&a)),
            (b.addr(), server_total_jobs(&b)),
        ],
    };
    campaigns::enqueue_step(&mut conn, campaign, &dead, None, Some(&intent)).unwrap();
    let put = |bs: &Beanstalkd, from: usize| {
        let mut c = bs.client();
        c.use_tube(&env.tube).unwrap();
        c.put(
            &env.signed_job(campaign, &all[from..from + 100]),
            1_000,
            Duration::ZERO,
            Duration::from_secs(60),
        )
        .unwrap()
    };
    put(&a, 0);
    let taken = put(&a, 100);
    put(&a, 200);
    put(&b, 300);
    put(&a, 9_000);
    // A worker took the second job, recorded its outcomes and deleted it.
    a.client().delete(taken).unwrap();
    env.sql(&format!(
        "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at) \
         SELECT {campaign}, recipient_id, 'sent', 1, 0 FROM list_members \
         WHERE recipient_id BETWEEN {} AND {}",
        all[100], all[199]
    ));

    b.stop();
    let err = fails(&env.run(&["enqueue", "c"]), 1);
    assert!(err.contains(&b.addr()), "{err}");
    assert_eq!(env.status("c")["jobs"], 0, "nothing confirmed without b");
    b.restart();

    let run = env.run(&["enqueue", "c"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(
        in_doubt_outcome(&stderr(&run)),
        "400 found in the queue, 100 in the ledger, 9500 put again",
        "{}",
        stderr(&run)
    );
    assert!(
        stdout(&run).contains("enqueued 24500 recipients in 245 jobs"),
        "this run's own puts: {}",
        stdout(&run)
    );
    let s = env.status("c");
    assert_eq!(
        (&s["state"], &s["enqueued"], &s["jobs"]),
        (&"sending".into(), &25_000.into(), &250.into()),
        "{s}"
    );
    let jobs: Vec<Job> = drain_jobs(&a, &env.tube)
        .into_iter()
        .chain(drain_jobs(&b, &env.tube))
        .collect();
    assert_eq!(jobs.len(), 249, "every job but the one a worker took");
    assert!(jobs.iter().all(|j| j.ids.len() == 100), "jobs of 100 only");
    let mut in_queue_or_ledger: Vec<i64> = all[100..200].to_vec();
    in_queue_or_ledger.extend(jobs.iter().flat_map(|j| j.ids.iter().copied()));
    let once = Job {
        pri: 0,
        campaign,
        ids: in_queue_or_ledger,
    };
    assert_each_once(&[once], campaign, usize::MAX, &all);
}

/// beanstalkd dies under a running enqueue; after it comes back from its
/// binlog, a second run puts the rest. The job that was being put when the
/// server died is either found in the binlog or put again — never both.
fn beanstalkd_killed_mid_enqueue(kind: Kind) {
    let (_tmp, mut bs, env) = setup(kind);
    // The killed runs' jobs wait out a lease before they are recovered.
    let env = env.short_lease(5_000);
    env.import_bulk("big", 150_000);
    let all = member_ids(&env, "big");
    for attempt in 0..4 {
        let name = format!("big{attempt}");
        create_ok(&env, &name, "big", &[]);
        let Some(mut child) = enqueue_until(&env, &bs, &name, 300) else {
            eprintln!("attempt {attempt}: enqueue finished before the kill; again");
            bs.drain(&env.tube);
            continue;
        };
        let killed_at = Instant::now();
        bs.stop();
        let status = wait_exit(&mut child, 60);
        let err = child_stderr(&mut child);
        if status.success() {
            eprintln!("attempt {attempt}: enqueue finished before the kill; again");
            bs.restart();
            bs.drain(&env.tube);
            continue;
        }
        eprintln!(
            "enqueue noticed the dead server in {:?}",
            killed_at.elapsed()
        );
        assert_eq!(status.code(), Some(1), "{err}");
        assert!(err.contains(&bs.addr()), "{err}");

        bs.restart();
        let ready = bs.tube_stat(&env.tube, "current-jobs-ready");
        assert!((300..1_500).contains(&ready), "{ready}");
        assert_counters_behind_queue(&env, &name, ready);

        let run = env.run(&["enqueue", &name]);
        assert!(run.status.success(), "{}", stderr(&run));
        eprintln!(
            "resumed ({} in-doubt job): {}",
            in_doubt_outcome(&stderr(&run)),
            stdout(&run)
        );
        let s = env.status(&name);
        assert_eq!(
            (&s["enqueued"], &s["jobs"]),
            (&150_000.into(), &1_500.into()),
            "{s}"
        );
        let jobs = drain_jobs(&bs, &env.tube);
        assert_eq!(jobs.len(), 1_500);
        assert_each_once(&jobs, s["id"].as_i64().unwrap(), 100, &all);
        return;
    }
    panic!("enqueue always finished before beanstalkd could be killed");
}

both!(
    unmigrated_database_says_run_migrate,
    enqueue_resumes_after_kill = |kind| enqueue_resumes_after_kills(kind, 1),
    enqueue_resumes_after_repeated_kills = |kind| enqueue_resumes_after_kills(kind, 3),
    an_interrupted_window_is_finished_exactly,
    beanstalkd_killed_mid_enqueue,
);
