//! DKIM: keys kept in the database (`mailsplit dkim keygen|list|delete`),
//! and the signatures of messages captured at a real SMTP peer, checked by
//! an independent verifier: Python's dkimpy (scripts/install-deps.sh
//! installs it), its DNS look-ups answered from the TXT records that
//! `dkim keygen` printed. RSA and ed25519; `h=` covers both
//! List-Unsubscribe headers; a message altered after signing fails.

use std::process::Command;

use crate::util::{header, stderr, stdout, wait_done, Beanstalkd, Env, Kind, Script, ScriptedSmtp};

/// The `name:` and `value:` of the TXT record a `dkim keygen` or `dkim
/// list` printed (the first one).
pub(crate) fn txt_record(output: &str) -> (String, String) {
    let field = |key: &str| {
        output
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key:?} in\n{output}"))
            .trim()
            .to_string()
    };
    (field("name:"), field("value:"))
}

/// dkimpy's verdict on each signature of `message`, looking keys up in
/// `records` only.
pub(crate) fn dkimpy(message: &str, records: &[(String, String)]) -> Vec<serde_json::Value> {
    verify(message, records, &[])["results"]
        .as_array()
        .unwrap()
        .clone()
}

/// [`dkimpy`] playing a verifier that does not know ed25519 (RFC 8463):
/// every verdict, and whether it passes the message on its top signature
/// (dkimpy's default).
pub(crate) fn dkimpy_without_ed25519(
    message: &str,
    records: &[(String, String)],
) -> (Vec<serde_json::Value>, bool) {
    let v = verify(message, records, &["--no-ed25519"]);
    (
        v["results"].as_array().unwrap().clone(),
        v["first_ok"] == true,
    )
}

fn verify(message: &str, records: &[(String, String)], flags: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("message.eml");
    std::fs::write(&file, message).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/dkim_verify.py");
    let out = Command::new("python3")
        .arg(script)
        .args(flags)
        .arg(&file)
        .args(records.iter().map(|(n, v)| format!("{n}={v}")))
        .output()
        .expect("python3 is missing: run scripts/install-deps.sh");
    assert!(
        out.status.code() != Some(3),
        "the DKIM verifier is missing: {}",
        stderr(&out)
    );
    assert!(out.status.success(), "dkim_verify.py: {}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

/// The message as the sender wrote it: SMTP's dot-stuffing undone.
pub(crate) fn unstuffed(text: &str) -> String {
    text.split_inclusive("\r\n")
        .map(|l| {
            l.strip_prefix('.')
                .filter(|r| r.starts_with('.'))
                .unwrap_or(l)
        })
        .collect()
}

fn keys_are_kept_in_the_database(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let out = env.ok(&["dkim", "keygen", "Example.TEST"]);
    let (name, value) = txt_record(&out);
    assert_eq!(name, "mailsplit._domainkey.example.test");
    assert!(value.starts_with("v=DKIM1; k=rsa; p=MII"), "{value}");
    let ed = env.ok(&[
        "dkim",
        "keygen",
        "example.test",
        "--algorithm",
        "ed25519",
        "--selector",
        "ed1",
    ]);
    let (ed_name, ed_value) = txt_record(&ed);
    assert_eq!(ed_name, "ed1._domainkey.example.test");
    assert!(ed_value.starts_with("v=DKIM1; k=ed25519; p="), "{ed_value}");
    // An international domain is filed under its A-labels.
    let idn = env.ok(&["dkim", "keygen", "bücher.test", "--algorithm", "ed25519"]);
    assert_eq!(
        txt_record(&idn).0,
        "mailsplit._domainkey.xn--bcher-kva.test"
    );

    // list shows every key with its record, exactly as keygen printed it.
    let list = env.ok(&["dkim", "list"]);
    assert!(list.contains(&format!(
        "  name:  {name}\n  type:  TXT\n  value: {value}\n"
    )));
    assert!(list.contains(&ed_value));
    // The private keys are never printed.
    let mut conn = env.conn();
    let stored = mailsplit::store::dkim_keys::list(&mut conn).unwrap();
    assert_eq!(stored.len(), 3);
    for key in &stored {
        let secret = key.private_key();
        for shown in [&out, &ed, &idn, &list] {
            assert!(
                !shown.contains(&secret[40..80]),
                "a private key was printed"
            );
        }
        assert!(!format!("{key:?}").contains(&secret[40..80]));
    }

    // A second key of the same algorithm, or a selector taken: refused.
    for again in [
        &["dkim", "keygen", "example.test"][..],
        &["dkim", "keygen", "example.test", "--selector", "ed1"][..],
    ] {
        let out = env.run(again);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("dkim delete example.test"),
            "{}",
            stderr(&out)
        );
    }
    for bad in [
        &["dkim", "keygen", "not a domain"][..],
        &["dkim", "keygen", "example.test", "--selector", "a_b"][..],
        &["dkim", "keygen", "example.test", "--algorithm", "dsa"][..],
        &["dkim", "delete", "nokey.test"][..],
    ] {
        let out = env.run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
    }

    // delete: one selector, then the rest of the domain.
    env.ok(&["dkim", "delete", "example.test", "--selector", "ed1"]);
    let list = env.ok(&["dkim", "list"]);
    assert!(!list.contains("ed1._domainkey") && list.contains(&name));
    env.ok(&["dkim", "delete", "EXAMPLE.test"]);
    let list = env.ok(&["dkim", "list"]);
    assert!(!list.contains("example.test") && list.contains("xn--bcher-kva.test"));
}

fn signatures_verify_with_dkimpy(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        keep_data: true,
        ..Script::default()
    });
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    env.ok(&["migrate"]);
    let rsa = txt_record(&env.ok(&["dkim", "keygen", "example.test", "--selector", "s1"]));
    let ed = txt_record(&env.ok(&[
        "dkim",
        "keygen",
        "example.test",
        "--selector",
        "s2",
        "--algorithm",
        "ed25519",
    ]));
    let csv = env.dir.path().join("people.csv");
    let long = "Very Long Name ".repeat(12);
    std::fs::write(
        &csv,
        format!(
            "email,name,city\n\
             ada@example.test,Ada,Paris\n\
             zoe@example.test,Zoë Ünïcode,Zürich\n\
             long@example.test,{long},\"Line one\"\n\
             dot@example.test,.Dot,.\n"
        ),
    )
    .unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "people"]);
    env.create_campaign(
        "signed",
        "people",
        &["--public-url", "http://127.0.0.1:9/mail"],
    );
    let out = env.run(&[
        "campaign",
        "create",
        "unsigned",
        "--list",
        "people",
        "--template",
        "announcement",
        "--subject",
        "Plain",
        "--from",
        "news@unsigned.test",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unsigned.test has no DKIM key"),
        "{}",
        stderr(&out)
    );
    env.ok(&["enqueue", "signed"]);
    env.ok(&["enqueue", "unsigned"]);
    let _w = env.worker(&[]);
    wait_done(&env, "signed", 60);
    wait_done(&env, "unsigned", 60);
    let messages: Vec<String> = peer
        .messages
        .lock()
        .unwrap()
        .iter()
        .map(|(_, text)| unstuffed(text))
        .collect();
    assert_eq!(messages.len(), 8);
    let records = [rsa.clone(), ed.clone()];
    let (signed, unsigned): (Vec<&String>, Vec<&String>) = messages
        .iter()
        .partition(|m| header(m, "Subject") != ["Plain"]);
    assert_eq!((signed.len(), unsigned.len()), (4, 4));
    for m in &unsigned {
        assert!(header(m, "DKIM-Signature").is_empty(), "{m}");
    }
    for m in &signed {
        let results = dkimpy(m, &records);
        assert_eq!(results.len(), 2, "{m}");
        for r in &results {
            assert_eq!(r["ok"], true, "dkimpy refused {r}\n{m}");
            assert_eq!(r["d"], "example.test");
            let h: Vec<&str> = r["h"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            for name in [
                "from",
                "to",
                "subject",
                "date",
                "message-id",
                "mime-version",
                "content-type",
                "list-id",
                "list-unsubscribe",
                "list-unsubscribe-post",
                "feedback-id",
            ] {
                assert!(h.contains(&name), "h= lacks {name}: {h:?}");
            }
        }
        let algorithms: Vec<&str> = results.iter().map(|r| r["a"].as_str().unwrap()).collect();
        assert_eq!(algorithms, ["rsa-sha256", "ed25519-sha256"]);
        assert_eq!(
            header(m, "List-Unsubscribe-Post"),
            ["List-Unsubscribe=One-Click"]
        );
        assert!(header(m, "List-Unsubscribe")[0].starts_with("<http://127.0.0.1:9/mail/u/"));
    }

    // Altered after signing: every signature fails.
    let m = signed
        .iter()
        .find(|m| m.contains("Paris"))
        .unwrap()
        .to_string();
    let link = header(&m, "List-Unsubscribe")[0].clone();
    let tampered = [
        ("body", m.replacen("Paris", "Paris!", 1)),
        (
            "List-Unsubscribe",
            m.replacen(&link, "<https://evil.test/u/x>", 1),
        ),
        (
            "a second List-Unsubscribe",
            m.replacen(
                "\r\nList-Unsubscribe:",
                "\r\nList-Unsubscribe: <https://evil.test/u/x>\r\nList-Unsubscribe:",
                1,
            ),
        ),
        (
            "Subject",
            m.replacen("Subject: Hello", "Subject: Hello!", 1),
        ),
    ];
    for (what, altered) in tampered {
        assert_ne!(altered, m, "{what}: nothing was altered");
        for r in dkimpy(&altered, &records) {
            assert_eq!(r["ok"], false, "altered {what}, still verifies: {r}");
        }
    }
    // And a key that is not the published one fails too.
    let wrong = [
        (rsa.0.clone(), ed.1.replace("k=ed25519", "k=rsa")),
        (ed.0.clone(), rsa.1.replace("k=rsa", "k=ed25519")),
    ];
    for r in dkimpy(&m, &wrong) {
        assert_eq!(r["ok"], false, "{r}");
    }
}

both!(keys_are_kept_in_the_database, signatures_verify_with_dkimpy,);
