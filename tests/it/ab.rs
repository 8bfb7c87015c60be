//! A/B tests on campaigns, against the real binary, `serve`, beanstalkd,
//! an SMTP peer that keeps what it accepts, SQLite and PostgreSQL: the
//! sample is drawn at random (not the first ids) and split into its
//! variants; nobody else is mailed before the decision; readers' clicks
//! through the real tracking links pick the winner, which goes to the
//! rest unattended; every recipient gets exactly one message and the
//! ledger says which variant; a paused campaign picks no winner until it
//! is resumed.

use std::collections::{BTreeMap, BTreeSet};

use crate::util::*;
use mailsplit::store::ab::{self, Assigned};
use mailsplit::store::DeliveryState;

const HTML: &str = "<html><body><p>Hello {{ email }}</p>\n\
    <p><a href=\"https://shop.example/offer\">Offer</a></p>\n</body></html>\n";

pub(crate) fn file(env: &Env, name: &str, text: &str) -> String {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

pub(crate) fn import(env: &Env, n: usize) {
    let mut csv = String::from("email\n");
    for i in 0..n {
        csv.push_str(&format!("r{i:04}@example.test\n"));
    }
    let path = file(env, "people.csv", &csv);
    env.ok(&["migrate"]);
    env.ok(&["import", &path, "--list", "people"]);
}

fn create(env: &Env, name: &str, public_url: &str, extra: &[&str]) {
    let html = file(env, "m.html", HTML);
    let mut args = vec![
        "campaign",
        "create",
        name,
        "--list",
        "people",
        "--html",
        &html,
        "--subject",
        "Subject A",
        "--variant-subject",
        "Subject B",
        "--from",
        "news@shop.example",
        "--public-url",
        public_url,
        "--ab-sample",
        "20%",
    ];
    args.extend_from_slice(extra);
    env.ok(&args);
}

/// Each accepted message's recipient with its subject and HTML part, in
/// the order accepted.
pub(crate) fn accepted(peer: &ScriptedSmtp) -> Vec<(String, String, String)> {
    let got = peer.messages.lock().unwrap();
    got.iter()
        .map(|(to, raw)| {
            let subject = header(raw, "Subject")[0].clone();
            (
                to[0].clone(),
                subject,
                parts(raw).html.replace("&#x2f;", "/"),
            )
        })
        .collect()
}

/// Recipient ids by address, of the `n` imported.
pub(crate) fn ids(env: &Env, n: usize) -> BTreeMap<String, i64> {
    let mut c = env.conn();
    (0..n)
        .map(|i| {
            let email = format!("r{i:04}@example.test");
            let id = mailsplit::store::recipients::find_by_email(&mut c, &email);
            (email, id.unwrap().unwrap())
        })
        .collect()
}

/// The test as stored, and each recipient's place in it before the
/// decision (by the same keyed hash the workers use).
fn sample(env: &Env, campaign: i64, ids: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    let test = ab::get(&mut env.conn(), campaign).unwrap().unwrap();
    let undecided = ab::AbTest {
        winner: None,
        ..test
    };
    ids.iter()
        .filter_map(|(email, &id)| match undecided.assign(id, 2) {
            Assigned::Variant(v) => Some((email.clone(), v)),
            Assigned::Held => None,
        })
        .collect()
}

fn winner_goes_to_the_rest(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, 600);
    let serve = env.serve(None);
    let base = format!("http://127.0.0.1:{}", serve.public);
    create(
        &env,
        "ab",
        &base,
        &[
            "--ab-wait",
            "10s",
            "--ab-metric",
            "clicks",
            "--track",
            "clicks",
        ],
    );
    let status = env.status("ab");
    assert_eq!(status["winner"], serde_json::Value::Null, "{status}");
    assert_eq!(status["variants"][1]["subject"], "Subject B", "{status}");
    let id = status["id"].as_i64().unwrap();
    let ids = ids(&env, 600);
    let sample = sample(&env, id, &ids);
    // About a fifth, split about evenly, and not the first ids.
    assert!((80..=160).contains(&sample.len()), "{}", sample.len());
    let b = sample.values().filter(|v| **v == 1).count();
    assert!(
        b * 10 >= sample.len() * 3 && b * 10 <= sample.len() * 7,
        "{b} of {}",
        sample.len()
    );
    let first: BTreeSet<&String> = ids.keys().take(sample.len()).collect();
    assert_ne!(first, sample.keys().collect::<BTreeSet<_>>());

    env.ok(&["enqueue", "ab"]);
    let w = env.worker(&[]);
    wait_for(60, "the sample's messages", || {
        peer.messages.lock().unwrap().len() >= sample.len()
    });
    let got = accepted(&peer);
    // Only the sample, each with its own variant's subject.
    for (to, subject, _) in &got {
        let v = sample
            .get(to)
            .unwrap_or_else(|| panic!("{to} is not in the sample"));
        assert_eq!(subject, ["Subject A", "Subject B"][*v as usize], "{to}");
    }
    // B's readers click (the real tracking link, through serve).
    let mut clicked = 0;
    for (to, _, html) in &got {
        if sample[to] != 1 {
            continue;
        }
        let link = html.split("href=\"").nth(1).unwrap();
        let link = &link[..link.find('"').unwrap()];
        let path = link.strip_prefix(&base).unwrap_or_else(|| panic!("{link}"));
        let r = http("GET", serve.public, path, &[], None);
        assert!(matches!(r.status, 302 | 303), "{r:?}");
        clicked += 1;
    }
    wait_for(30, "the clicks recorded", || {
        env.status("ab")["clicked"].as_i64() == Some(clicked)
    });
    let status = env.status("ab");
    assert_eq!(
        status["winner"],
        serde_json::Value::Null,
        "decided before the clicks were recorded (a slow machine?): {status}"
    );
    // Nobody else while undecided.
    assert_eq!(peer.messages.lock().unwrap().len(), sample.len());

    wait_for(60, "the winner", || env.status("ab")["winner"] == "B");
    wait_done(&env, "ab", 60);
    stop_worker(w);

    let got = accepted(&peer);
    assert_eq!(got.len(), 600, "every recipient exactly once");
    let mut seen = BTreeSet::new();
    for (to, subject, _) in &got {
        assert!(seen.insert(to.clone()), "{to} twice");
        let want = sample
            .get(to)
            .map_or("Subject B", |v| ["Subject A", "Subject B"][*v as usize]);
        assert_eq!(subject, want, "{to}");
    }
    // The ledger records each one's variant.
    let by_id: BTreeMap<i64, &String> = ids.iter().map(|(e, i)| (*i, e)).collect();
    let ledger = ab::ledger(&mut env.conn(), id).unwrap();
    assert_eq!(ledger.len(), 600);
    for (rid, state, variant) in ledger {
        assert_eq!(state, DeliveryState::Sent);
        let want = sample.get(by_id[&rid]).copied().unwrap_or(1);
        assert_eq!(variant, Some(want), "recipient {rid}");
    }
    let status = env.status("ab");
    assert_eq!(status["winner"], "B");
    let variants = status["variants"].as_array().unwrap();
    let sent: Vec<i64> = variants
        .iter()
        .map(|v| v["sent"].as_i64().unwrap())
        .collect();
    assert_eq!(
        sent,
        [(sample.len() - b) as i64, 600 - (sample.len() - b) as i64]
    );
    assert_eq!(variants[1]["clicked"].as_i64(), Some(clicked));
    assert_eq!(status["sent"].as_i64(), Some(600));
}

fn paused_across_the_wait(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, 200);
    create(
        &env,
        "ab",
        "http://127.0.0.1:9",
        &["--ab-wait", "3s", "--track", "opens"],
    );
    let id = env.status("ab")["id"].as_i64().unwrap();
    let sample = sample(&env, id, &ids(&env, 200));
    env.ok(&["enqueue", "ab"]);
    let w = env.worker(&[]);
    wait_for(60, "the sample's messages", || {
        peer.messages.lock().unwrap().len() >= sample.len()
    });
    env.ok(&["pause", "ab"]);
    // Past the decision time, paused: no winner, nobody else mailed.
    let test = ab::get(&mut env.conn(), id).unwrap().unwrap();
    let decide_at = test.decide_at().unwrap();
    wait_for(30, "the decision time to pass", || {
        mailsplit::store::now_ms() > decide_at + 2_000
    });
    let status = env.status("ab");
    assert_eq!(status["winner"], serde_json::Value::Null, "{status}");
    assert_eq!(status["state"], "paused");
    assert_eq!(peer.messages.lock().unwrap().len(), sample.len());

    env.ok(&["resume", "ab"]);
    // Nobody opened anything: a tie, A wins.
    wait_for(180, "the winner", || env.status("ab")["winner"] == "A");
    let test = ab::get(&mut env.conn(), id).unwrap().unwrap();
    assert!(test.decided_at.unwrap() > decide_at + 2_000, "{test:?}");
    wait_done(&env, "ab", 180);
    stop_worker(w);
    let got = accepted(&peer);
    assert_eq!(got.len(), 200);
    for (to, subject, _) in &got {
        let want = sample
            .get(to)
            .map_or("Subject A", |v| ["Subject A", "Subject B"][*v as usize]);
        assert_eq!(subject, want, "{to}");
    }
}

/// The options are checked before anything is stored.
fn bad_options_name_the_fix(kind: Kind) {
    let (_tmp, _bs, _peer, env) = setup(kind, Script::default());
    import(&env, 3);
    let html = file(&env, "m.html", HTML);
    let base = [
        "campaign",
        "create",
        "x",
        "--list",
        "people",
        "--html",
        &html,
        "--subject",
        "S",
        "--from",
        "news@shop.example",
        "--public-url",
        "http://127.0.0.1:9",
        "--track",
        "opens",
    ];
    for (extra, says) in [
        (
            &["--ab-sample", "20%", "--ab-wait", "2h"][..],
            "--variant-subject",
        ),
        (
            &["--variant-subject", "B", "--ab-wait", "2h"][..],
            "--ab-sample 20%",
        ),
        (
            &[
                "--variant-subject",
                "B",
                "--ab-sample",
                "70%",
                "--ab-wait",
                "2h",
            ][..],
            "1% to 50%",
        ),
        (
            &[
                "--variant-subject",
                "B",
                "--ab-sample",
                "20%",
                "--ab-wait",
                "2w",
            ][..],
            "s, m, h or d",
        ),
        (
            &[
                "--variant-subject",
                "B",
                "--ab-sample",
                "20%",
                "--ab-wait",
                "2h",
                "--ab-metric",
                "clicks",
            ][..],
            "--track clicks",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    assert_eq!(
        env.run(&["status", "x"]).status.code(),
        Some(2),
        "nothing stored"
    );
}

both!(
    winner_goes_to_the_rest,
    paused_across_the_wait,
    bad_options_name_the_fix
);
