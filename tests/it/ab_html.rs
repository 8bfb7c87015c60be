//! A/B tests whose variants have HTML of their own (`--variant-html`, and
//! `ab.variant_html` through `/api/v1`), against the real binary, `serve`,
//! beanstalkd, an SMTP peer that keeps what it accepts, SQLite and
//! PostgreSQL: each variant's message carries its own HTML and links; a
//! click through serve's click URL on variant B's link credits B and
//! redirects to B's URL (never A's); the winner's HTML goes to the rest;
//! every recipient gets exactly one message, and the ledger says which.
//! The subject-only test and the options' checks are in `ab`.

use std::collections::{BTreeMap, BTreeSet};

use crate::ab::{accepted, file, ids, import};
use crate::api::{call, json_of, TOKEN};
use crate::util::*;
use mailsplit::store::ab::{self, Assigned};
use mailsplit::store::DeliveryState;
use serde_json::json;

const HTML_A: &str = "<html><body><p>Variant A for {{ email }}</p>\n\
    <p><a href=\"https://shop.example/offer-a\">Offer</a></p>\n</body></html>\n";
const HTML_B: &str = "<html><head><style>p.b { color: #c00 }</style></head><body>\n\
    <p class=\"b\">Variant B for {{ email }}</p>\n\
    <p><a href=\"https://shop.example/offer-b?from=b\">Offer</a></p>\n</body></html>\n";

const OFFER_A: &str = "https://shop.example/offer-a";
const OFFER_B: &str = "https://shop.example/offer-b?from=b";

/// What each variant's message says, A first.
const MARK: [&str; 3] = ["Variant A for", "Variant B for", "Variant A for"];
const SUBJECT: [&str; 3] = ["Subject A", "Subject B", "Subject C"];

/// Each sample member's variant among `variants`, by address, before the
/// decision (by the keyed hash the workers use).
fn sample(
    env: &Env,
    campaign: i64,
    ids: &BTreeMap<String, i64>,
    variants: i64,
) -> BTreeMap<String, i64> {
    let test = ab::get(&mut env.conn(), campaign).unwrap().unwrap();
    let undecided = ab::AbTest {
        winner: None,
        ..test
    };
    ids.iter()
        .filter_map(|(email, &id)| match undecided.assign(id, variants) {
            Assigned::Variant(v) => Some((email.clone(), v)),
            Assigned::Held => None,
        })
        .collect()
}

/// The first tracked link of a message's HTML, as a path on `base`.
fn click_path<'a>(html: &'a str, base: &str) -> &'a str {
    let link = html.split("href=\"").nth(1).unwrap();
    let link = &link[..link.find('"').unwrap()];
    link.strip_prefix(base)
        .unwrap_or_else(|| panic!("not a tracked link: {link}"))
}

/// Follow a message's tracked link through serve: where it redirects.
fn follow(port: u16, html: &str, base: &str) -> String {
    let r = http("GET", port, click_path(html, base), &[], None);
    assert_eq!(r.status, 302, "{r:?}");
    r.header("location").unwrap().to_string()
}

/// The sample is split into equal parts (up to chance): each variant has
/// at least a fifth less and at most a fifth more than its share.
fn assert_even(sample: &BTreeMap<String, i64>, variants: i64) {
    let share = sample.len() as f64 / variants as f64;
    for v in 0..variants {
        let n = sample.values().filter(|x| **x == v).count() as f64;
        assert!(
            n > share * 0.6 && n < share * 1.4,
            "variant {v}: {n} of {}",
            sample.len()
        );
    }
}

/// Every recipient exactly once, the sample with its own variant and the
/// rest with `winner`, each message with its variant's subject, HTML and
/// link; the ledger agrees.
fn assert_one_each(
    env: &Env,
    peer: &ScriptedSmtp,
    campaign: i64,
    (ids, sample): (&BTreeMap<String, i64>, &BTreeMap<String, i64>),
    winner: i64,
) {
    let got = accepted(peer);
    assert_eq!(got.len(), ids.len(), "every recipient exactly once");
    let mut seen = BTreeSet::new();
    for (to, subject, html) in &got {
        assert!(seen.insert(to.clone()), "{to} twice");
        let v = sample.get(to).copied().unwrap_or(winner) as usize;
        assert_eq!(subject, SUBJECT[v], "{to}");
        assert!(html.contains(&format!("{} {to}", MARK[v])), "{to}: {html}");
    }
    let by_id: BTreeMap<i64, &String> = ids.iter().map(|(e, i)| (*i, e)).collect();
    let ledger = ab::ledger(&mut env.conn(), campaign).unwrap();
    assert_eq!(ledger.len(), ids.len());
    for (rid, state, variant) in ledger {
        assert_eq!(state, DeliveryState::Sent);
        let want = sample.get(by_id[&rid]).copied().unwrap_or(winner);
        assert_eq!(variant, Some(want), "recipient {rid}");
    }
}

fn html_variants_credit_their_own_links(kind: Kind) {
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
    let (a, b) = (file(&env, "a.html", HTML_A), file(&env, "b.html", HTML_B));
    // B: its own subject and HTML; C: its own subject, A's HTML.
    let args = [
        "campaign",
        "create",
        "ab",
        "--list",
        "people",
        "--html",
        &a,
        "--subject",
        "Subject A",
        "--variant-subject",
        "Subject B",
        "--variant-html",
        &b,
        "--variant-subject",
        "Subject C",
        "--from",
        "news@shop.example",
        "--public-url",
        &base,
        "--ab-sample",
        "30%",
        "--ab-wait",
        "10s",
        "--ab-metric",
        "clicks",
        "--track",
        "clicks",
    ];
    env.ok(&args);
    let status = env.status("ab");
    let subjects: Vec<&str> = status["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, SUBJECT, "{status}");
    let id = status["id"].as_i64().unwrap();
    let ids = ids(&env, 600);
    let sample = sample(&env, id, &ids, 3);
    assert_even(&sample, 3);

    env.ok(&["enqueue", "ab"]);
    let w = env.worker(&[]);
    wait_for(60, "the sample's messages", || {
        peer.messages.lock().unwrap().len() >= sample.len()
    });
    // B's readers all click, one of A's: each link goes where its own
    // variant's HTML said.
    let got = accepted(&peer);
    let (mut clicked_b, mut clicked_a) = (0, 0);
    for (to, _, html) in &got {
        match sample[to] {
            1 => {
                assert_eq!(follow(serve.public, html, &base), OFFER_B, "{to}");
                clicked_b += 1;
            }
            0 if clicked_a == 0 => {
                assert_eq!(follow(serve.public, html, &base), OFFER_A, "{to}");
                clicked_a += 1;
            }
            _ => {}
        }
    }
    // A's token with another link number than its own: nothing.
    let (_, _, html_a) = got.iter().find(|(to, _, _)| sample[to] == 0).unwrap();
    let own = click_path(html_a, &base);
    let other = format!("{}/2", own.strip_suffix("/1").unwrap());
    assert_eq!(http("GET", serve.public, &other, &[], None).status, 404);
    wait_for(30, "the clicks recorded", || {
        env.status("ab")["clicked"].as_i64() == Some(clicked_a + clicked_b)
    });
    assert_eq!(
        env.status("ab")["winner"],
        serde_json::Value::Null,
        "decided before the clicks were recorded (a slow machine?)"
    );
    assert_eq!(peer.messages.lock().unwrap().len(), sample.len());

    wait_for(60, "the winner", || env.status("ab")["winner"] == "B");
    wait_done(&env, "ab", 60);
    stop_worker(w);
    assert_one_each(&env, &peer, id, (&ids, &sample), 1);
    // The rest got B's links too: they redirect to B's URL.
    let rest = accepted(&peer)
        .into_iter()
        .find(|(to, _, _)| !sample.contains_key(to))
        .unwrap();
    assert_eq!(follow(serve.public, &rest.2, &base), OFFER_B);
    let clicked = || -> Vec<i64> {
        env.status("ab")["variants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["clicked"].as_i64().unwrap())
            .collect()
    };
    let want = vec![clicked_a, clicked_b + 1, 0];
    wait_for(30, "each variant's clicks", || clicked() == want);
    let report: serde_json::Value =
        serde_json::from_str(&env.ok(&["report", "ab", "--json"])).unwrap();
    let hits: Vec<i64> = report["ab"]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["hits"].as_i64().unwrap())
        .collect();
    assert_eq!(hits, want, "{report}");
    // B's CSS was inlined, as the campaign's own would be.
    assert!(rest.2.contains("style=\"color: #c00"), "{}", rest.2);
}

fn api_ab_campaign_follows_to_its_winner(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, 200);
    let serve = env.serve(Some(TOKEN));
    let base = format!("http://127.0.0.1:{}", serve.public);
    let body = json!({
        "name": "api-ab", "list": "people", "subject": "Subject A",
        "from": "news@shop.example", "html": HTML_A, "track": "clicks",
        "public_url": base,
        "ab": {"variant_subjects": ["Subject B"], "variant_html": [HTML_B],
               "sample": "40%", "wait": "10s", "metric": "clicks"},
    });
    let r = call(serve.admin, "POST", "/api/v1/campaigns", TOKEN, Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    let made = json_of(&r);
    assert_eq!(made["winner"], serde_json::Value::Null, "{made}");
    assert_eq!(made["variants"][1]["subject"], "Subject B", "{made}");
    let id = made["id"].as_i64().unwrap();
    let ids = ids(&env, 200);
    let sample = sample(&env, id, &ids, 2);
    assert_even(&sample, 2);

    let path = "/api/v1/campaigns/api-ab/enqueue";
    assert_eq!(call(serve.admin, "POST", path, TOKEN, None).status, 202);
    let w = env.worker(&[]);
    wait_for(60, "the sample's messages", || {
        peer.messages.lock().unwrap().len() >= sample.len()
    });
    let mut clicked = 0;
    for (to, _, html) in accepted(&peer) {
        if sample[&to] == 1 && clicked < 3 {
            assert_eq!(follow(serve.public, &html, &base), OFFER_B, "{to}");
            clicked += 1;
        }
    }
    let get = || {
        let r = call(serve.admin, "GET", "/api/v1/campaigns/api-ab", TOKEN, None);
        assert_eq!(r.status, 200, "{}", r.body);
        json_of(&r)
    };
    wait_for(30, "the clicks recorded", || {
        get()["variants"][1]["clicked"].as_i64() == Some(clicked)
    });
    wait_for(60, "the winner", || get()["winner"] == "B");
    wait_done(&env, "api-ab", 60);
    stop_worker(w);
    assert_one_each(&env, &peer, id, (&ids, &sample), 1);
    let seen = get();
    assert_eq!(seen, env.status("api-ab"), "the API shows what status does");
    let sent: i64 = seen["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["sent"].as_i64().unwrap())
        .sum();
    assert_eq!(sent, 200, "{seen}");
}

/// Variant HTML is refused as `--html` would be, with the place and the
/// fix named, and nothing is stored.
fn bad_variants_name_the_fix(kind: Kind) {
    let (_tmp, _bs, _peer, env) = setup(kind, Script::default());
    import(&env, 3);
    let a = file(&env, "a.html", HTML_A);
    let broken = file(&env, "broken.html", "<p>ok</p>\n<p>{% if %}</p>\n");
    let script = file(
        &env,
        "js.html",
        "<p>\n<a href=\"javascript:go()\">x</a></p>",
    );
    let base = [
        "campaign",
        "create",
        "x",
        "--list",
        "people",
        "--html",
        &a,
        "--subject",
        "S",
        "--from",
        "news@shop.example",
        "--public-url",
        "http://127.0.0.1:9",
        "--track",
        "opens",
        "--ab-sample",
        "20%",
        "--ab-wait",
        "2h",
    ];
    let ten: Vec<&str> = (0..10).flat_map(|_| ["--variant-html", &a]).collect();
    for (extra, says) in [
        (vec!["--variant-html", &broken], "broken.html:2:"),
        (vec!["--variant-html", &script], "js.html:2: link"),
        (
            vec!["--variant-html", &script],
            "write an http(s) or mailto link",
        ),
        (ten, "at most 9 (B to J)"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(&extra);
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    assert_eq!(env.run(&["status", "x"]).status.code(), Some(2));

    let serve = env.serve(Some(TOKEN));
    let body = json!({
        "name": "y", "list": "people", "subject": "S", "from": "news@shop.example",
        "html": HTML_A, "track": "opens", "public_url": "http://127.0.0.1:9",
        "ab": {"variant_html": [HTML_B, "<p>ok</p>\n<p>{% if %}</p>"],
               "sample": "20%", "wait": "2h"},
    });
    let r = call(serve.admin, "POST", "/api/v1/campaigns", TOKEN, Some(&body));
    assert_eq!(r.status, 422, "{}", r.body);
    let detail = json_of(&r)["detail"].as_str().unwrap().to_string();
    assert!(
        detail.starts_with("ab.variant_html[1]:2:") && !detail.contains("mailsplit-api-"),
        "{detail}"
    );
    assert_eq!(env.run(&["status", "y"]).status.code(), Some(2));
}

both!(
    html_variants_credit_their_own_links,
    api_ab_campaign_follows_to_its_winner,
    bad_variants_name_the_fix
);
