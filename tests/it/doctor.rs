//! `mailsplit doctor DOMAIN --resolver HOST:PORT` against a local DNS
//! server (tests/support/dns_server.py, Python's dnslib): the right
//! records pass; a wrong DKIM key and a missing DMARC record fail, each
//! naming its check, and the command exits 1.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::json;

use crate::dkim::txt_record;
use crate::util::{Kind, World};

/// The DNS server on a free port, answering from `zone` (re-read on every
/// question). Killed when dropped.
pub(crate) struct Dns {
    child: Child,
    port: u16,
}

impl Dns {
    pub(crate) fn start(zone: &Path) -> Dns {
        Dns::start_logged(zone, None)
    }
    /// With `log`, every question is appended to that file as "NAME TYPE".
    pub(crate) fn start_logged(zone: &Path, log: Option<&Path>) -> Dns {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/dns_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(zone)
            .args(log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 is missing: run scripts/install-deps.sh");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("dns_server.py printed {line:?}, not a port: is dnslib installed (scripts/install-deps.sh)?"));
        Dns { child, port }
    }
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The zone of shop.test with its DKIM record (`dkim_value`) and, when
/// `dmarc`, a DMARC record.
fn zone(dkim_name: &str, dkim_value: &str, dmarc: bool) -> serde_json::Value {
    let mut z = json!({
        dkim_name: {"TXT": [dkim_value]},
        "shop.test": {"TXT": ["v=spf1 ip4:192.0.2.10 -all"], "MX": [[10, "mx.shop.test"]]},
        "bounce.shop.test": {"TXT": ["v=spf1 ip4:192.0.2.10 -all"], "MX": [[10, "mx.shop.test"]]},
    });
    if dmarc {
        z["_dmarc.shop.test"] = json!({"TXT": ["v=DMARC1; p=quarantine; rua=mailto:d@shop.test"]});
    }
    z
}

/// The lines of `doctor`'s report whose check is `name`.
fn line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("no {name:?} line in\n{out}"))
}

#[test]
fn right_records_pass_and_a_wrong_dkim_key_or_missing_dmarc_fails_naming_the_check() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    let (name, value) = txt_record(&env.ok(&["dkim", "keygen", "shop.test"]));
    let dir = tempfile::tempdir().unwrap();
    let zone_file = dir.path().join("zone.json");
    std::fs::write(&zone_file, zone(&name, &value, true).to_string()).unwrap();
    let dns = Dns::start(&zone_file);
    let doctor = |env: &World| {
        env.cmd(&[
            "doctor",
            "shop.test",
            "--resolver",
            &dns.addr(),
            "--return-path",
            "bounces@bounce.shop.test",
            "--smtp",
            "smtp://192.0.2.10:25",
        ])
        .output()
        .unwrap()
    };

    // Right records: every DNS check passes; no public URL is only a warning.
    let out = doctor(&env);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "doctor failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "DKIM mailsplit",
        "SPF",
        "DMARC",
        "alignment",
        "return-path MX",
    ] {
        assert!(
            line(&text, check).starts_with("pass"),
            "{check} did not pass:\n{text}"
        );
    }
    assert!(line(&text, "unsubscribe URL").starts_with("warn"), "{text}");
    assert!(line(&text, "SPF").contains("192.0.2.10"), "{text}");

    // Another key published under the selector, and no DMARC record.
    let other = env.ok(&["dkim", "keygen", "other.test"]);
    let (_, other_value) = txt_record(&other);
    assert_ne!(other_value, value);
    std::fs::write(&zone_file, zone(&name, &other_value, false).to_string()).unwrap();
    let out = doctor(&env);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "doctor should exit 1:\n{text}");
    let dkim = line(&text, "DKIM mailsplit");
    assert!(
        dkim.starts_with("FAIL") && dkim.contains("not the one mailsplit signs with"),
        "{text}"
    );
    let dmarc = line(&text, "DMARC");
    assert!(
        dmarc.starts_with("FAIL") && dmarc.contains("_dmarc.shop.test"),
        "{text}"
    );
    // What did not change still passes: the failures are the checks' own.
    assert!(line(&text, "SPF").starts_with("pass"), "{text}");
    assert!(line(&text, "return-path MX").starts_with("pass"), "{text}");
    assert!(text.contains("2 check(s) failed"), "{text}");
}

#[test]
fn a_missing_dkim_record_and_a_missing_mx_fail() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    env.ok(&["dkim", "keygen", "shop.test"]);
    let dir = tempfile::tempdir().unwrap();
    let zone_file = dir.path().join("zone.json");
    // No DKIM record, no MX for the return path's domain.
    let z = json!({
        "shop.test": {"TXT": ["v=spf1 -all"]},
        "_dmarc.shop.test": {"TXT": ["v=DMARC1; p=none"]},
    });
    std::fs::write(&zone_file, z.to_string()).unwrap();
    let dns = Dns::start(&zone_file);
    let out = env.run(&["doctor", "shop.test", "--resolver", &dns.addr()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(line(&text, "DKIM mailsplit").starts_with("FAIL"), "{text}");
    assert!(
        line(&text, "DKIM mailsplit").contains("no TXT record at mailsplit._domainkey.shop.test"),
        "{text}"
    );
    assert!(line(&text, "return-path MX").starts_with("FAIL"), "{text}");
    assert!(line(&text, "DMARC").starts_with("pass"), "{text}");
}
