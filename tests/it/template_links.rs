//! Links a template writes (`href="{{ u }}"` in a loop over a recipient's
//! products, `href="https://shop/p/{{ attributes.sku }}"`), tracked at
//! render time through `/l/TOKEN?u=URL`: each message's links point there,
//! a click redirects to exactly that recipient's URL and is counted by
//! URL (report, the `clicked` webhook event); a tampered `u`, another
//! recipient's token, a hostile `javascript:` attribute and a valid token
//! shown another host are refused with no `Location`; literal links and
//! the unsubscribe link work as before; `preview`'s links count nothing.

use std::collections::BTreeMap;

use crate::util::*;
use mailsplit::store::{template_links, webhooks};

const HTML: &str = "<html><body>\
    {% for u in [attributes.p1, attributes.p2] %}<a href=\"{{ u }}\">item</a>\n{% endfor %}\
    <a href=\"https://shop.example/p/{{ attributes.sku }}\">sku</a>\n\
    <a href=\"https://shop.example/b\">Shop</a>\n\
    <a href=\"{{ unsubscribe_url }}\">Unsubscribe</a>\n</body></html>\n";

const P1: &str = "https://shop.example/p/1?c=a&d=b";
const HOSTILE: &str = "javascript:alert(document.cookie)";

fn file(env: &Env, name: &str, text: &str) -> String {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn hrefs(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .map(|s| {
            s[..s.find('"').unwrap()]
                .replace("&#x2f;", "/")
                .replace("&amp;", "&")
        })
        .collect()
}

/// The HTML part of each accepted message, by address.
fn html_by_recipient(peer: &ScriptedSmtp) -> BTreeMap<String, String> {
    let got = peer.messages.lock().unwrap();
    got.iter()
        .map(|(to, raw)| (to[0].clone(), parts(raw).html))
        .collect()
}

/// A GET on the public listener that must be refused: 404 or 400 and no
/// `Location` at all.
fn refused(port: u16, path: &str) {
    let r = http("GET", port, path, &[], None);
    assert!(matches!(r.status, 400 | 404), "{path}: {r:?}");
    assert!(r.header("Location").is_none(), "{path}: {r:?}");
}

fn enc(url: &str) -> String {
    url.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn template_links_are_tracked_without_an_open_redirect(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    let csv = format!(
        "email,p1,p2,sku\nr0@example.test,\"{P1}\",https://other.example/x,11\n\
         r1@example.test,https://shop.example/p/2,\"{HOSTILE}\",22\n"
    );
    let csv = file(&env, "people.csv", &csv);
    env.ok(&["migrate"]);
    env.ok(&["import", &csv, "--list", "people"]);
    let mut serve = env.serve(None);
    let port = serve.public;
    let base = format!("http://127.0.0.1:{port}");
    let html = file(&env, "m.html", HTML);
    let text = file(&env, "m.txt", "Hello\n");
    env.ok(&[
        "campaign",
        "create",
        "tl",
        "--list",
        "people",
        "--html",
        &html,
        "--text",
        &text,
        "--subject",
        "News",
        "--from",
        "news@shop.example",
        "--public-url",
        &base,
        "--track",
        "clicks",
    ]);
    env.ok(&[
        "webhook",
        "add",
        "http://127.0.0.1:9/hook",
        "--events",
        "clicked",
        "--allow-local",
    ]);
    env.ok(&["enqueue", "tl"]);
    let w = env.worker(&[]);
    wait_done(&env, "tl", 60);
    stop_worker(w);

    let got = html_by_recipient(&peer);
    let (r0, r1) = (
        hrefs(&got["r0@example.test"]),
        hrefs(&got["r1@example.test"]),
    );
    let l = format!("{base}/l/");
    // Template-written web links wrapped; the literal one numbered as
    // before; the hostile one and the unsubscribe link as rendered.
    for links in [&r0, &r1] {
        assert_eq!(links.len(), 5, "{links:?}");
        assert!(links[2].starts_with(&l), "{links:?}");
        assert!(links[3].starts_with(&format!("{base}/c/")) && links[3].ends_with("/1"));
        assert!(links[4].starts_with(&format!("{base}/u/")), "{links:?}");
    }
    assert!(r0[0].starts_with(&l) && r0[1].starts_with(&l), "{r0:?}");
    assert!(r1[0].starts_with(&l), "{r1:?}");
    assert_eq!(r1[1], HOSTILE, "a javascript: attribute is no tracked link");
    assert!(!got["r0@example.test"].contains("https://shop.example/p/"));
    let path = |url: &str| url.strip_prefix(&base).unwrap().to_string();
    let token = |url: &str| url[l.len()..url.find('?').unwrap()].to_string();
    let (t0_p1, t0_p2, t1_p1) = (token(&r0[0]), token(&r0[1]), token(&r1[0]));

    // Refused, no Location: a changed `u`; another recipient's token for
    // r0's URL; r1's token for its own hostile attribute; r0's genuine
    // token for other.example shown another host; a forged token; no `u`,
    // or two.
    for bad in [
        format!("/l/{t0_p1}?u={}", enc("https://evil.example/p/1?c=a&d=b")),
        format!("/l/{t0_p1}?u={}", enc("https://shop.example/p/1?c=a&d=c")),
        format!("/l/{t1_p1}?u={}", enc(P1)),
        format!("/l/{t1_p1}?u={}", enc(HOSTILE)),
        format!("/l/{t0_p2}?u={}", enc("https://evil.example/x")),
        format!(
            "/l/{}?u={}",
            t0_p1.replace('A', "B").replace('a', "A"),
            enc(P1)
        ),
        format!("/l/{t0_p1}"),
        format!(
            "/l/{t0_p1}?u={}&u={}",
            enc(P1),
            enc("https://evil.example/")
        ),
        format!("/c/{t0_p1}/1"),
    ] {
        refused(port, &bad);
    }
    // r0 follows its product link twice: to exactly its URL.
    for _ in 0..2 {
        let r = http("GET", port, &path(&r0[0]), &[], None);
        assert_eq!(r.status, 302, "{r:?}");
        assert_eq!(r.header("Location"), Some(P1));
    }
    let r = http("GET", port, &path(&r0[2]), &[], None);
    assert_eq!(r.header("Location"), Some("https://shop.example/p/11"));
    // The literal link works as before.
    let r = http("GET", port, &path(&r0[3]), &[], None);
    assert_eq!(r.header("Location"), Some("https://shop.example/b"));

    // preview: links naming nobody; following one counts nothing.
    let preview = parts(&env.ok(&["preview", "tl", "--recipient", "r1@example.test"])).html;
    let p = hrefs(&preview);
    assert!(p[0].starts_with(&l), "{p:?}");
    let signer = env.identity().signer;
    let m = signer
        .read_link(&token(&p[0]), "https://shop.example/p/2")
        .unwrap();
    assert_eq!(m.recipient, 0, "a preview's link names no recipient");
    assert_eq!(p[1], HOSTILE);
    let r = http("GET", port, &path(&p[0]), &[], None);
    assert_eq!(r.header("Location"), Some("https://shop.example/p/2"));

    signal(&serve.proc.0, "TERM");
    assert!(wait_exit(&mut serve.proc.0, 20).success());
    let status = env.status("tl");
    assert_eq!(status["clicked"], 1, "only r0 clicked: {status}");
    assert_eq!(status["clicks"], 4, "{status}");
    let id = status["id"].as_i64().unwrap();
    let (top, distinct) = template_links::top(&mut env.conn(), id, 10).unwrap();
    assert_eq!(
        top,
        [
            (P1.to_string(), 2),
            ("https://shop.example/p/11".to_string(), 1)
        ]
    );
    assert_eq!(distinct, 2);
    let report: serde_json::Value =
        serde_json::from_str(&env.ok(&["report", "tl", "--json"])).unwrap();
    assert_eq!(
        report["tracking"]["template_links"][0]["url"], P1,
        "{report}"
    );
    assert_eq!(report["tracking"]["template_urls_clicked"], 2);
    // The first click's webhook event carries the URL the render produced.
    let mut conn = env.conn();
    let hook = webhooks::list(&mut conn).unwrap()[0].0.id;
    let events = webhooks::batch(&mut conn, hook, 10).unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].url.as_deref(), Some(P1));
    assert_eq!(events[0].email.as_deref(), Some("r0@example.test"));
}

both!(template_links_are_tracked_without_an_open_redirect);
