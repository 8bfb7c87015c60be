//! Tracking of flow steps (issue 39): a join flow of two steps whose
//! marketing templates track opens and clicks. Against the real binary,
//! `serve`, beanstalkd, the scripted SMTP peer, SQLite and PostgreSQL:
//! the steps' pixels and links, fetched through `serve`, show per step in
//! `flow report --json` as unique counts (two opens by one person count
//! once; an Apple prefetch counts not at all); a link redirects exactly
//! where the message pointed, and a forged or altered token is refused;
//! the subscriber's page and the webhook outbox show them; the steps'
//! `{{ preferences_url }}` and `{{ view_url }}` open the recipient's own
//! pages.

use std::io::Write;

use crate::util::*;

/// A mail client's user agent (not Apple's bare prefetcher).
const BROWSER: (&str, &str) = (
    "User-Agent",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120 Safari/537.36",
);
/// Apple Mail Privacy Protection's prefetch.
const APPLE: (&str, &str) = ("User-Agent", "Mozilla/5.0");

/// Marketing templates `welcome` and `tips`, tracked, links to the shop
/// and to the recipient's own pages.
fn templates(env: &Env, base: &str) {
    for (name, link) in [
        ("welcome", "https://shop.example/a?x=1&amp;y=2"),
        ("tips", "https://shop.example/tips"),
    ] {
        let html = env.dir.path().join(format!("{name}.html"));
        std::fs::write(
            &html,
            format!(
                "<html><body><p>{name} {{{{ name }}}}: <a href=\"{link}\">shop</a> \
                 <a href=\"{{{{ preferences_url }}}}\">preferences</a> \
                 <a href=\"{{{{ view_url }}}}\">view</a></p></body></html>\n"
            ),
        )
        .unwrap();
        env.ok(&[
            "template",
            "create",
            name,
            "--subject",
            &format!("{name} {{{{ name }}}}"),
            "--from",
            "shop@example.test",
            "--html",
            html.to_str().unwrap(),
            "--stream",
            "marketing",
            "--track",
            "opens,clicks",
            "--public-url",
            base,
        ]);
    }
}

/// The HTML part of the message whose subject is `subject`.
fn html_of(peer: &ScriptedSmtp, subject: &str) -> String {
    let got = peer.messages.lock().unwrap();
    let raw = got
        .iter()
        .map(|(_, raw)| raw)
        .find(|raw| header(raw, "Subject").iter().any(|s| s == subject))
        .unwrap_or_else(|| panic!("no message {subject:?}"));
    parts(raw).html.replace("&#x2f;", "/").replace("&amp;", "&")
}

/// Every `href` value, and the pixel's `src`, of an HTML part.
fn urls(html: &str) -> (Vec<String>, String) {
    let values = |key: &str| -> Vec<String> {
        html.split(key)
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].to_string())
            .collect()
    };
    let pixel = values("<img src=\"").pop().expect("a pixel");
    (values("href=\""), pixel)
}

fn path_of(url: &str, base: &str) -> String {
    url.strip_prefix(base)
        .unwrap_or_else(|| panic!("{url} is not under {base}"))
        .to_string()
}

fn report(env: &Env) -> serde_json::Value {
    serde_json::from_str(env.ok(&["flow", "report", "welcome", "--json"]).trim()).unwrap()
}

fn flow_steps_are_tracked(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    )
    .var("MAILSPLIT_FLOW_TICK_MS", "200");
    let peer = env.peer();
    env.ok(&["migrate"]);
    let serve = env.serve(None);
    let (port, base) = (serve.public, format!("http://127.0.0.1:{}", serve.public));
    templates(&env, &base);
    // Refused without the public URL the pixel and links point at.
    let out = env.run(&["template", "edit", "tips", "--public-url", ""]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--public-url"), "{}", stderr(&out));
    env.ok(&[
        "webhook",
        "add",
        "http://127.0.0.1:9/hook",
        "--events",
        "opened,clicked",
        "--allow-local",
    ]);
    env.ok(&[
        "flow",
        "create",
        "welcome",
        "--list",
        "news",
        "--step",
        "0:welcome",
        "--step",
        "1s:tips",
    ]);
    let csv = env.dir.path().join("new.csv");
    let mut f = std::fs::File::create(&csv).unwrap();
    writeln!(f, "email,name\nann@example.test,ann\nbob@example.test,bob").unwrap();
    drop(f);
    env.ok(&["import", csv.to_str().unwrap(), "--list", "news"]);
    let w = env.worker(&[]);
    wait_for(60, "both steps to both members", || peer.total() == 4);
    stop_worker(w);
    // An hour ago: these opens are readers', not a proxy's on delivery.
    env.sql("UPDATE messages SET sent_at = sent_at - 3600000");

    let (ann1, ann1_pixel) = urls(&html_of(peer, "welcome ann"));
    let (ann2, _) = urls(&html_of(peer, "tips ann"));
    let (_, bob1_pixel) = urls(&html_of(peer, "welcome bob"));
    assert!(ann1[0].starts_with(&format!("{base}/l/")), "{ann1:?}");
    assert!(
        ann1_pixel.starts_with(&format!("{base}/o/")),
        "{ann1_pixel}"
    );
    assert!(
        ann1[1].starts_with(&format!("{base}/p/")) && ann1[2].starts_with(&format!("{base}/v/")),
        "{ann1:?}"
    );

    // ann opens step 1 twice and clicks it twice; bob's pixel is fetched by
    // Apple's prefetch only; ann clicks step 2's link without opening it.
    for _ in 0..2 {
        let r = http("GET", port, &path_of(&ann1_pixel, &base), &[BROWSER], None);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("content-type"), Some("image/gif"));
        let r = http("GET", port, &path_of(&ann1[0], &base), &[BROWSER], None);
        assert_eq!(r.status, 302, "{r:?}");
        assert_eq!(r.header("location"), Some("https://shop.example/a?x=1&y=2"));
    }
    let r = http("GET", port, &path_of(&bob1_pixel, &base), &[APPLE], None);
    assert_eq!(r.status, 200, "{r:?}");
    let r = http("GET", port, &path_of(&ann2[0], &base), &[BROWSER], None);
    assert_eq!(
        r.header("location"),
        Some("https://shop.example/tips"),
        "{r:?}"
    );

    // Refused and recorded nowhere: a forged token, the genuine token for
    // another URL (no open redirect), the pixel's token as a link's.
    let click = path_of(&ann1[0], &base);
    let (path, query) = click.split_once('?').unwrap();
    let token = &path[3..];
    let mut forged = token.to_string().into_bytes();
    forged[4] = if forged[4] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let pixel_token = &path_of(&ann1_pixel, &base)[3..];
    for bad in [
        format!("/l/{forged}?{query}"),
        format!("/l/{token}?u=https%3A%2F%2Fevil.example%2F"),
        format!("/l/{pixel_token}?{query}"),
        format!("/o/{forged}"),
        format!("/c/{token}/1"),
    ] {
        let r = http("GET", port, &bad, &[BROWSER], None);
        assert_eq!(r.status, 404, "{bad}: {r:?}");
        assert!(r.header("location").is_none(), "{bad}");
    }

    // Unique per step: ann's two opens count once, bob's prefetch not at all.
    wait_for(20, "the hits in the report", || {
        let r = report(&env);
        r["steps"][0]["clicked"] == 1 && r["steps"][1]["clicked"] == 1
    });
    let r = report(&env);
    let per_step: Vec<(i64, i64, i64)> = (0..2)
        .map(|i| {
            let s = &r["steps"][i];
            let n = |k: &str| s[k].as_i64().unwrap_or_else(|| panic!("{k}: {r}"));
            (n("sent"), n("opened"), n("clicked"))
        })
        .collect();
    assert_eq!(per_step, vec![(2, 1, 1), (2, 0, 1)], "{r}");
    let text = env.ok(&["flow", "report", "welcome"]);
    assert!(
        text.contains("sent 2, failed 0, suppressed 0, opened 1, clicked 1"),
        "{text}"
    );

    // The webhooks hear of each first open by a person and first click.
    let mut c = env.conn();
    let events = mailsplit::store::webhooks::batch(&mut c, 1, 100).unwrap();
    let mut kinds: Vec<(String, Option<String>)> = events
        .iter()
        .filter(|e| e.message.is_some())
        .map(|e| (e.kind.as_str().to_string(), e.url.clone()))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            (
                "clicked".into(),
                Some("https://shop.example/a?x=1&y=2".into())
            ),
            ("clicked".into(), Some("https://shop.example/tips".into())),
            ("opened".into(), None),
        ]
    );

    // The subscriber's page: ann's step 1 with its opens and clicks.
    let page = http(
        "GET",
        serve.admin,
        "/subscribers/ann@example.test",
        &[],
        None,
    );
    assert_eq!(page.status, 200, "{}", page.body);
    let row = page
        .body
        .split("<tr data-template=\"welcome\">")
        .nth(1)
        .unwrap_or_else(|| panic!("{}", page.body));
    assert!(
        row.contains("<td class=\"num opens\">2</td><td class=\"num clicks\">2</td>"),
        "{row}"
    );

    // The recipient's own pages, from the step's links.
    let view = http("GET", port, &path_of(&ann1[2], &base), &[BROWSER], None);
    assert_eq!(view.status, 200, "{view:?}");
    assert!(view.body.contains("welcome ann"), "{}", view.body);
    let prefs = path_of(&ann1[1], &base);
    let p = http("GET", port, &prefs, &[BROWSER], None);
    assert_eq!(p.status, 200, "{p:?}");
    assert!(p.body.contains("value=\"ann\""), "{}", p.body);
    let saved = http(
        "POST",
        port,
        &prefs,
        &[],
        Some("name=Ann&unsubscribe_all=1"),
    );
    assert_eq!(saved.status, 200, "{saved:?}");
    assert!(
        saved.body.contains("You are unsubscribed"),
        "{}",
        saved.body
    );
    // Another recipient's token is none of these.
    let r = http("GET", port, &format!("/p/{forged}"), &[BROWSER], None);
    assert_eq!(r.status, 404);
}

both!(flow_steps_are_tracked);
