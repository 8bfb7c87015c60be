//! DKIM with more than one key: an RSA and an ed25519 key sign every
//! message twice (RFC 8463), and a verifier that does not know ed25519
//! still passes it on the RSA signature; `dkim rotate` makes a pending
//! key that signs nothing until `dkim activate`, which running workers
//! pick up within seconds. Every verdict is dkimpy's (tests/support).

use crate::dkim::{dkimpy, dkimpy_without_ed25519, txt_record, unstuffed};
use crate::util::*;

/// The `s=` of each DKIM-Signature of a message, top first.
fn selectors(text: &str) -> Vec<String> {
    header(text, "DKIM-Signature")
        .iter()
        .filter_map(|sig| {
            sig.split(';')
                .map(str::trim)
                .find_map(|t| t.strip_prefix("s="))
                .map(str::to_string)
        })
        .collect()
}

/// The line of `dkim list` about `selector`.
fn listed(env: &Env, selector: &str) -> String {
    env.ok(&["dkim", "list"])
        .lines()
        .find(|l| l.contains(&format!("selector {selector} ")))
        .unwrap_or_else(|| panic!("{selector} not listed"))
        .to_string()
}

fn rsa_and_ed25519_both_sign(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.import_n("news", 3);
    let rsa = txt_record(&env.ok(&["dkim", "keygen", "example.test"]));
    // No --selector: `mailsplit` is the RSA key's, so the ed25519 one
    // gets its own.
    let ed = txt_record(&env.ok(&["dkim", "keygen", "example.test", "--algorithm", "ed25519"]));
    assert_eq!(rsa.0, "mailsplit._domainkey.example.test");
    assert_eq!(ed.0, "mailsplit-ed25519._domainkey.example.test");
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&[]);
    wait_done(&env, "news", 60);
    let messages: Vec<String> = peer
        .messages
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| unstuffed(t))
        .collect();
    assert_eq!(messages.len(), 3);
    let records = [rsa.clone(), ed.clone()];
    for m in &messages {
        assert_eq!(selectors(m), ["mailsplit", "mailsplit-ed25519"], "{m}");
        let results = dkimpy(m, &records);
        let verdicts: Vec<(&str, bool)> = results
            .iter()
            .map(|r| (r["a"].as_str().unwrap(), r["ok"] == true))
            .collect();
        assert_eq!(
            verdicts,
            [("rsa-sha256", true), ("ed25519-sha256", true)],
            "{results:?}"
        );
        // A verifier from before RFC 8463: the ed25519 signature is an
        // unknown algorithm to it, and the message passes on the RSA one,
        // which is on top.
        let (old, passes) = dkimpy_without_ed25519(m, &records);
        assert_eq!(old[0]["ok"], true, "{old:?}");
        assert_eq!(old[1]["ok"], false, "{old:?}");
        assert!(
            old[1]["error"]
                .as_str()
                .unwrap_or_default()
                .contains("unknown signature algorithm"),
            "{old:?}"
        );
        assert!(passes, "{old:?}");
        // Only the ed25519 record published: the RSA one fails, ed25519 passes.
        let only_ed = dkimpy(m, std::slice::from_ref(&ed));
        assert_eq!(
            (only_ed[0]["ok"].clone(), only_ed[1]["ok"].clone()),
            (false.into(), true.into())
        );
    }
}

/// The first message at or after `from` whose selectors are `want`.
fn first_signed_with(peer: &ScriptedSmtp, from: usize, want: &[&str]) -> Option<(usize, String)> {
    let m = peer.messages.lock().unwrap();
    (from..m.len())
        .find(|&i| selectors(&m[i].1) == want)
        .map(|i| (i, unstuffed(&m[i].1)))
}

fn rotation_waits_for_activate(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            keep_data: true,
            data_delay: std::time::Duration::from_millis(50),
            ..Script::default()
        },
    );
    let peer = env.peer();
    env.import_n("news", 2_000);
    let old = txt_record(&env.ok(&["dkim", "keygen", "example.test"]));
    env.create_campaign("news", "news", &[]);
    env.ok(&["enqueue", "news"]);
    let _w = env.worker(&["--concurrency", "2"]);
    let count = || peer.messages.lock().unwrap().len();
    wait_for(30, "a few signed messages", || count() >= 5);

    let out = env.ok(&["dkim", "rotate", "example.test"]);
    let new = txt_record(&out);
    let selector = new.0.split('.').next().unwrap().to_string();
    assert!(selector.starts_with("mailsplit-20"), "{out}");
    assert!(new.1.starts_with("v=DKIM1; k=rsa; p=MII"), "{out}");
    assert_ne!(new.1, old.1);
    assert!(
        out.contains("still signed with selector mailsplit"),
        "{out}"
    );
    assert!(listed(&env, "mailsplit").contains("active"));
    assert!(listed(&env, &selector).contains("pending"));

    // Two refreshes later, every message is still signed with the old key
    // only (the pending one signs nothing), and verifies against its record.
    let rotated_at = count();
    wait_for(30, "messages after the rotation", || {
        count() > rotated_at + 60
    });
    {
        let m = peer.messages.lock().unwrap();
        for (_, text) in &m[rotated_at..] {
            assert_eq!(
                selectors(text),
                ["mailsplit"],
                "signed after rotate:\n{text}"
            );
        }
        let results = dkimpy(&unstuffed(&m[m.len() - 1].1), std::slice::from_ref(&old));
        assert_eq!(results[0]["ok"], true, "{results:?}");
    }

    let out = env.ok(&["dkim", "activate", "example.test", &selector]);
    assert!(out.contains("selector mailsplit is retired"), "{out}");
    let activated_at = count();
    // Within seconds, without a restart.
    wait_for(5, "a message signed with the new key", || {
        first_signed_with(peer, activated_at, &[&selector]).is_some()
    });
    let (at, m) = first_signed_with(peer, activated_at, &[&selector]).unwrap();
    let results = dkimpy(&m, &[old.clone(), new.clone()]);
    assert_eq!(results.len(), 1);
    assert_eq!(
        (results[0]["ok"].clone(), results[0]["s"].clone()),
        (true.into(), selector.clone().into())
    );
    // Against the old record alone it does not verify.
    assert_eq!(dkimpy(&m, std::slice::from_ref(&old))[0]["ok"], false);
    // Once switched, the retired key signs nothing more. What was composed
    // before still goes out, in any order with the first new ones: at most
    // the worker's pipeline at --concurrency 2, the senders' queue (2), a
    // message in each session (2) and a batch being signed on each core
    // (at most the queue's room, 2 each); all of it within that many
    // messages of the first new one, and none after.
    const COMPOSED_AHEAD: usize = 2 + 2 + 2 * 2;
    wait_for(30, "more messages", || count() > at + COMPOSED_AHEAD + 20);
    {
        let m = peer.messages.lock().unwrap();
        let late_old: Vec<usize> = (at..m.len())
            .filter(|&i| selectors(&m[i].1) != [selector.as_str()])
            .collect();
        assert!(
            late_old.len() <= COMPOSED_AHEAD && late_old.iter().all(|&i| i < at + COMPOSED_AHEAD),
            "signed with the retired key after the first new one (at {at}): {late_old:?}"
        );
    }
    assert!(listed(&env, &selector).contains("active"));
    assert!(listed(&env, "mailsplit").contains("retired"));
    env.ok(&["cancel", "news"]);
}

/// What rotate and activate refuse, each exit 2 naming the fix; and a
/// retired key can be activated again (switching back).
#[test]
fn rotate_and_activate_refuse_what_they_cannot_do() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let refused = |args: &[&str], says: &str| {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    };
    refused(
        &["dkim", "rotate", "example.test"],
        "dkim keygen example.test",
    );
    env.ok(&["dkim", "keygen", "example.test"]);
    env.ok(&["dkim", "keygen", "example.test", "--algorithm", "ed25519"]);
    refused(&["dkim", "rotate", "example.test"], "--algorithm");
    let rsa = ["dkim", "rotate", "example.test", "--algorithm", "rsa"];
    refused(
        &[&rsa[..], &["--selector", "mailsplit"]].concat(),
        "selector mailsplit",
    );
    refused(&[&rsa[..], &["--selector", "a_b"]].concat(), "bad selector");
    refused(&["dkim", "activate", "example.test", "nosuch"], "dkim list");
    refused(
        &["dkim", "activate", "not a domain", "mailsplit"],
        "bad domain",
    );
    // Another domain's key is not this domain's.
    env.ok(&["dkim", "keygen", "other.test", "--selector", "o1"]);
    refused(&["dkim", "activate", "example.test", "o1"], "dkim list");

    let out = env.ok(&[
        "dkim",
        "rotate",
        "example.test",
        "--algorithm",
        "ed25519",
        "--selector",
        "ed2",
    ]);
    assert!(out.contains("k=ed25519"), "{out}");
    assert!(
        out.contains("still signed with selector mailsplit-ed25519"),
        "{out}"
    );
    // A second rotation the same day gets its own selector.
    let a = txt_record(&env.ok(&["dkim", "rotate", "example.test", "--algorithm", "rsa"])).0;
    let b = txt_record(&env.ok(&["dkim", "rotate", "example.test", "--algorithm", "rsa"])).0;
    assert_ne!(a, b);
    assert!(
        b.starts_with(&format!("{}-2.", a.split('.').next().unwrap())),
        "{a} {b}"
    );
    // Activate, then switch back to the retired key: one active per algorithm.
    env.ok(&["dkim", "activate", "example.test", "ed2"]);
    env.ok(&["dkim", "activate", "example.test", "mailsplit-ed25519"]);
    assert!(listed(&env, "mailsplit-ed25519").contains("active"));
    assert!(listed(&env, "ed2").contains("retired"));
    assert!(listed(&env, "mailsplit").contains("active"));
    let stored = mailsplit::store::dkim_keys::for_domain(&mut env.conn(), "example.test").unwrap();
    let active: Vec<&str> = stored.iter().map(|k| k.selector.as_str()).collect();
    assert_eq!(active, ["mailsplit", "mailsplit-ed25519"]);
    // Activating the active key changes nothing.
    env.ok(&["dkim", "activate", "example.test", "mailsplit"]);
    assert!(listed(&env, "mailsplit").contains("active"));
}

both!(rsa_and_ed25519_both_sign, rotation_waits_for_activate,);
