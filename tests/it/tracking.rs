//! Open and click tracking and unsubscribes per campaign,
//! against the real binary, `serve`, beanstalkd, an SMTP peer that
//! keeps what it accepts, SQLite and PostgreSQL: tracked messages carry the
//! pixel and rewritten links (mailto and unsubscribe untouched), untracked
//! ones are untouched; a click redirects to exactly its link; forged and
//! altered tokens, another link number and an open-redirect attempt are
//! refused or ignored and record nothing; `status --json` counts unique
//! recipients and totals as the ledger does, machine opens apart.

use std::collections::BTreeMap;

use crate::util::*;
use mailsplit::store::engagement;

const HTML: &str = "<html><body><p>Hello {{ email }}</p>\n\
    <p><a href=\"https://shop.example/a?x=1&amp;y=2\">Offer</a>\n\
    <a href=\"https://shop.example/b\">Shop</a>\n\
    <a href=\"mailto:help@shop.example\">Write to us</a>\n\
    <a href=\"{{ unsubscribe_url }}\">Unsubscribe</a></p>\n</body></html>\n";
const TEXT: &str = "Hello {{ email }}\nShop: https://shop.example/b\n\
    Write to mailto:help@shop.example\nUnsubscribe: {{ unsubscribe_url }}\n";

/// A human reader's browser.
const BROWSER: (&str, &str) = (
    "User-Agent",
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
);

fn file(env: &Env, name: &str, text: &str) -> String {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn import(env: &Env, n: usize) {
    let mut csv = String::from("email\n");
    for i in 0..n {
        csv.push_str(&format!("r{i}@example.test\n"));
    }
    let path = file(env, "people.csv", &csv);
    env.ok(&["migrate"]);
    env.ok(&["import", &path, "--list", "people"]);
}

fn create(env: &Env, name: &str, public_url: &str, extra: &[&str]) {
    let (html, text) = (file(env, "m.html", HTML), file(env, "m.txt", TEXT));
    let mut args = vec![
        "campaign",
        "create",
        name,
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
        public_url,
    ];
    args.extend_from_slice(extra);
    env.ok(&args);
}

/// One accepted message: its HTML and text parts (transfer-decoded, HTML
/// entities in attributes decoded as a browser does) and List-Unsubscribe.
struct Got {
    html: String,
    text: String,
    unsubscribe: String,
}

fn parse(raw: &str) -> Got {
    let p = parts(raw);
    assert!(!p.html.is_empty() && !p.text.is_empty(), "{raw}");
    let html = p.html.replace("&#x2f;", "/");
    let text = p.text;
    let link = header(raw, "List-Unsubscribe");
    Got {
        html,
        text,
        unsubscribe: link[0].trim_matches(['<', '>']).to_string(),
    }
}

/// The messages each recipient got, by address.
fn messages(peer: &ScriptedSmtp) -> BTreeMap<String, Got> {
    let got = peer.messages.lock().unwrap();
    got.iter()
        .map(|(to, raw)| (to[0].clone(), parse(raw)))
        .collect()
}

/// Every `href` value of an HTML part.
fn hrefs(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_string())
        .collect()
}

/// The path of a URL on the public listener.
fn path_of(url: &str, port: u16) -> String {
    let base = format!("http://127.0.0.1:{port}");
    url.strip_prefix(&base)
        .unwrap_or_else(|| panic!("{url} is not under {base}"))
        .to_string()
}

/// Make the delivery to `email` an hour old, so that its opens count as a
/// reader's, not a machine's on delivery.
fn age_delivery(env: &Env, email: &str) {
    env.sql(&format!(
        "UPDATE deliveries SET updated_at = updated_at - 3600000 WHERE recipient_id = \
         (SELECT id FROM recipients WHERE email = '{email}')"
    ));
}

fn engagement_json(s: &serde_json::Value) -> [i64; 7] {
    [
        "opened",
        "opens",
        "machine_opened",
        "machine_opens",
        "clicked",
        "clicks",
        "unsubscribed",
    ]
    .map(|k| s[k].as_i64().unwrap_or_else(|| panic!("no {k} in {s}")))
}

fn tracked_campaign_counts_what_readers_do(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, 4);
    let mut serve = env.serve(None);
    let base = format!("http://127.0.0.1:{}", serve.public);
    create(&env, "tracked", &base, &["--track", "opens,clicks"]);
    let id = env.status("tracked")["id"].as_i64().unwrap();
    env.ok(&["enqueue", "tracked"]);
    let w = env.worker(&[]);
    wait_done(&env, "tracked", 60);
    stop_worker(w);

    let got = messages(&peer);
    assert_eq!(got.len(), 4);
    let port = serve.public;
    for (to, m) in &got {
        let links = hrefs(&m.html);
        assert_eq!(links.len(), 4, "{to}: {}", m.html);
        assert!(
            links[0].starts_with(&format!("{base}/c/")) && links[0].ends_with("/1"),
            "{to}: {links:?}"
        );
        assert!(
            links[1].starts_with(&format!("{base}/c/")) && links[1].ends_with("/2"),
            "{to}: {links:?}"
        );
        assert_eq!(links[2], "mailto:help@shop.example", "{to}");
        assert_eq!(
            links[3], m.unsubscribe,
            "{to}: the unsubscribe link is the one-click one"
        );
        assert!(
            links[3].starts_with(&format!("{base}/u/")),
            "{to}: {links:?}"
        );
        assert!(
            !m.html.contains("shop.example/a") && !m.html.contains("shop.example/b"),
            "{to}: {}",
            m.html
        );
        let pixel = format!("<img src=\"{base}/o/");
        assert!(m.html.contains(&pixel), "{to}: {}", m.html);
        assert!(m.html.find(&pixel).unwrap() < m.html.find("</body>").unwrap());
        // The text part's link is link 2 as well; mailto and unsubscribe stay.
        assert!(!m.text.contains("https://shop.example"), "{to}: {}", m.text);
        assert!(
            m.text.contains("Shop: http://127.0.0.1:"),
            "{to}: {}",
            m.text
        );
        assert!(
            m.text.contains("mailto:help@shop.example"),
            "{to}: {}",
            m.text
        );
        assert!(
            m.text.contains(&format!("Unsubscribe: {}", m.unsubscribe)),
            "{to}: {}",
            m.text
        );
    }
    let r0 = &got["r0@example.test"];
    let (click1, click2) = {
        let l = hrefs(&r0.html);
        (path_of(&l[0], port), path_of(&l[1], port))
    };
    let open_of = |email: &str| {
        let html = &got[email].html;
        let at = html.find("/o/").unwrap();
        html[at..at + html[at..].find('"').unwrap()].to_string()
    };

    // Refused, and recorded nowhere: a forged token, a genuine token with
    // another link number, a token of another purpose, a token with a
    // valid MAC for a link the version does not have.
    let (token1, _) = click1[3..].rsplit_once('/').unwrap();
    let mut forged = token1.to_string().into_bytes();
    forged[3] = if forged[3] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let signer = env.identity().signer;
    let m = signer.read_click(token1, 1).unwrap();
    let beyond = signer.click_token(m, 3);
    for bad in [
        format!("/c/{forged}/1"),
        format!("/c/{token1}/2"),
        format!("/c/{token1}/0"),
        format!("/c/{token1}/x"),
        format!("/c/{beyond}/3"),
        format!("/o/{token1}"),
        format!(
            "/o/{}",
            &open_of("r0@example.test")[3..]
                .replace('A', "B")
                .replace('a', "A")
        ),
        format!("/c/{}/1", &open_of("r0@example.test")[3..]),
    ] {
        let r = http("GET", port, &bad, &[BROWSER], None);
        assert_eq!(r.status, 404, "{bad}: {r:?}");
        assert!(r.header("Location").is_none(), "{bad}");
    }

    // A click goes to exactly its link, whatever the query says.
    let r = http(
        "GET",
        port,
        &format!("{click1}?url=https://evil.example"),
        &[BROWSER],
        None,
    );
    assert!(matches!(r.status, 302 | 303), "{r:?}");
    assert_eq!(r.header("Location"), Some("https://shop.example/a?x=1&y=2"));
    let r = http("GET", port, &click2, &[BROWSER], None);
    assert_eq!(r.header("Location"), Some("https://shop.example/b"));
    let r = http("GET", port, &click1, &[BROWSER], None);
    assert_eq!(r.header("Location"), Some("https://shop.example/a?x=1&y=2"));
    let r1 = &got["r1@example.test"];
    let r1_click2 = path_of(&hrefs(&r1.html)[1], port);
    assert_eq!(
        http("GET", port, &r1_click2, &[BROWSER], None).header("Location"),
        Some("https://shop.example/b")
    );

    // Opens: r0 three times and r1 once by readers (deliveries an hour
    // old); r2 through Google's image proxy, which fetches when the reader
    // opens (a reader's open); r3 right after delivery (a machine's).
    for email in ["r0@example.test", "r1@example.test", "r2@example.test"] {
        age_delivery(&env, email);
    }
    for (email, times, agent) in [
        ("r0@example.test", 3, BROWSER.1),
        ("r1@example.test", 1, BROWSER.1),
        ("r2@example.test", 1, "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)"),
        ("r3@example.test", 1, BROWSER.1),
    ] {
        for _ in 0..times {
            let r = http("GET", port, &open_of(email), &[("User-Agent", agent)], None);
            assert_eq!(r.status, 200, "{email}: {r:?}");
            assert_eq!(r.header("Content-Type"), Some("image/gif"));
        }
    }
    // r1 unsubscribes by the campaign's link, twice: once counted.
    for _ in 0..2 {
        let path = path_of(&r1.unsubscribe, port);
        let r = http("POST", port, &path, &[], Some("List-Unsubscribe=One-Click"));
        assert_eq!(r.status, 200, "{r:?}");
    }
    // SIGTERM: what is queued is recorded before serve exits.
    signal(&serve.proc.0, "TERM");
    assert!(wait_exit(&mut serve.proc.0, 20).success());

    let status = env.status("tracked");
    // opened 3 (r0, r1, r2) of 5 opens; machine 1 (on delivery);
    // clicked 2 (r0, r1) of 4 clicks; unsubscribed 1.
    assert_eq!(engagement_json(&status), [3, 5, 1, 1, 2, 4, 1], "{status}");
    let ledger = engagement::counted(&mut env.conn(), id).unwrap();
    let counters = engagement::counts(&mut env.conn(), &[id]).unwrap()[&id];
    assert_eq!(ledger, counters);
    let per_link: Vec<(i64, String, i64)> = engagement::link_clicks(&mut env.conn(), id)
        .unwrap()
        .into_iter()
        .map(|(_, n, url, clicks)| (n, url, clicks))
        .collect();
    assert_eq!(
        per_link,
        [
            (1, "https://shop.example/a?x=1&y=2".to_string(), 2),
            (2, "https://shop.example/b".to_string(), 2)
        ]
    );
    let text = env.ok(&["status", "tracked"]);
    assert!(
        text.contains("opened 3 (5 opens; machine 1)  clicked 2 (4 clicks)  unsubscribed 1"),
        "{text}"
    );
}

#[test]
fn tracked_campaign_counts_what_readers_do_sqlite() {
    tracked_campaign_counts_what_readers_do(Kind::Sqlite);
}

#[test]
fn tracked_campaign_counts_what_readers_do_pg() {
    tracked_campaign_counts_what_readers_do(Kind::Postgres);
}

/// Without `--track` nothing changes; `--track` needs the public URL and
/// a known word; `campaign edit --track none` turns it off.
#[test]
fn tracking_is_off_by_default_and_edits_turn_it_off() {
    let env = World::new(Kind::Sqlite);
    import(&env, 2);
    let base = "http://127.0.0.1:9";
    create(&env, "plain", base, &[]);
    let m = parse(&env.ok(&["preview", "plain"]));
    assert_eq!(
        hrefs(&m.html)[..3],
        [
            "https://shop.example/a?x=1&amp;y=2",
            "https://shop.example/b",
            "mailto:help@shop.example"
        ]
    );
    assert!(
        !m.html.contains("/o/") && !m.html.contains("<img"),
        "{}",
        m.html
    );
    assert!(
        m.text.contains("Shop: https://shop.example/b"),
        "{}",
        m.text
    );

    let (html, text) = (file(&env, "m.html", HTML), file(&env, "m.txt", TEXT));
    let base_args = [
        "campaign",
        "create",
        "x",
        "--list",
        "people",
        "--html",
        &html,
        "--text",
        &text,
        "--subject",
        "S",
        "--from",
        "news@shop.example",
    ];
    let out = env.run(&[&base_args[..], &["--track", "opens"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--public-url"), "{}", stderr(&out));
    let out = env.run(
        &[
            &base_args[..],
            &["--public-url", base, "--track", "opens,views"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("opens, clicks"), "{}", stderr(&out));

    create(&env, "opens", base, &["--track", "opens"]);
    let m = parse(&env.ok(&["preview", "opens"]));
    assert!(
        m.html.contains(&format!("<img src=\"{base}/o/")),
        "{}",
        m.html
    );
    assert!(
        m.html.contains("href=\"https://shop.example/b\""),
        "opens only: {}",
        m.html
    );
    env.ok(&["campaign", "edit", "opens", "--track", "clicks"]);
    let m = parse(&env.ok(&["preview", "opens"]));
    assert!(!m.html.contains("/o/"), "{}", m.html);
    assert!(
        !m.html.contains("href=\"https://shop.example/b\""),
        "{}",
        m.html
    );
    env.ok(&["campaign", "edit", "opens", "--track", "none"]);
    let m = parse(&env.ok(&["preview", "opens"]));
    assert!(
        !m.html.contains("/o/") && !m.html.contains("/c/"),
        "{}",
        m.html
    );
    // A later edit of the subject keeps what the version tracked.
    env.ok(&["campaign", "edit", "opens", "--track", "opens,clicks"]);
    env.ok(&["campaign", "edit", "opens", "--subject", "Other"]);
    let m = parse(&env.ok(&["preview", "opens"]));
    assert!(
        m.html.contains("/o/") && m.html.contains("/c/"),
        "{}",
        m.html
    );
}

/// Wait until `serve` has recorded what was hit: `status --json` shows
/// `want` (`engagement_json`'s order).
fn wait_recorded(env: &Env, name: &str, want: [i64; 7]) {
    for _ in 0..200 {
        if engagement_json(&env.status(name)) == want {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("never recorded {want:?}: {}", env.status(name));
}

/// `report` and the campaign page show opens and clicks: after
/// hits through `serve`'s real `/o/` and `/c/`, `report --json`'s
/// `tracking` equals the ledger's engagement rows, clicks per link are
/// each link's own (3 on link 1, 2 on link 2, so a swap shows), and the
/// page's opens and clicks charts sum to the unique openers and clickers.
fn report_and_page_show_engagement(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, 4);
    let serve = env.serve(None);
    let (port, base) = (serve.public, format!("http://127.0.0.1:{}", serve.public));
    create(&env, "tracked", &base, &["--track", "opens,clicks"]);
    let id = env.status("tracked")["id"].as_i64().unwrap();
    env.ok(&["enqueue", "tracked"]);
    let w = env.worker(&[]);
    wait_done(&env, "tracked", 60);
    stop_worker(w);
    let got = messages(&peer);
    for email in got.keys() {
        age_delivery(&env, email);
    }
    let link = |email: &str, i: usize| path_of(&hrefs(&got[email].html)[i], port);
    let open = |email: &str| {
        let html = &got[email].html;
        let at = html.find("/o/").unwrap();
        html[at..at + html[at..].find('"').unwrap()].to_string()
    };
    // Clicks: r0 link 1 three times and link 2 once, r1 link 2 once.
    // Opens: r0 twice and r2 once by readers, r3 by Apple's prefetch.
    let hits = [
        (link("r0@example.test", 0), 3, BROWSER.1),
        (link("r0@example.test", 1), 1, BROWSER.1),
        (link("r1@example.test", 1), 1, BROWSER.1),
        (open("r0@example.test"), 2, BROWSER.1),
        (open("r2@example.test"), 1, BROWSER.1),
        (open("r3@example.test"), 1, "Mozilla/5.0"),
    ];
    for (path, times, agent) in &hits {
        for _ in 0..*times {
            let r = http("GET", port, path, &[("User-Agent", agent)], None);
            assert!(matches!(r.status, 200 | 302 | 303), "{path}: {r:?}");
        }
    }
    wait_recorded(&env, "tracked", [2, 3, 1, 1, 2, 5, 0]);
    let ledger = engagement::counted(&mut env.conn(), id).unwrap();

    let r: serde_json::Value =
        serde_json::from_str(&env.ok(&["report", "tracked", "--json"])).unwrap();
    let t = &r["tracking"];
    assert_eq!(t["tracks"], "opens,clicks", "{t}");
    let e = ledger;
    assert_eq!(
        engagement_json(t),
        [
            e.opened,
            e.opens,
            e.machine_opened,
            e.machine_opens,
            e.clicked,
            e.clicks,
            e.unsubscribed
        ],
        "{t}"
    );
    assert_eq!(engagement_json(t), [2, 3, 1, 1, 2, 5, 0], "{t}");
    let links: Vec<(i64, i64, &str, i64)> = t["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let n = |k: &str| l[k].as_i64().unwrap();
            (
                n("version"),
                n("link"),
                l["url"].as_str().unwrap(),
                n("clicks"),
            )
        })
        .collect();
    assert_eq!(
        links,
        [
            (1, 1, "https://shop.example/a?x=1&y=2", 3),
            (1, 2, "https://shop.example/b", 2)
        ]
    );
    let text = env.ok(&["report", "tracked"]);
    assert!(
        text.contains(
            "opened 2 (3 opens; machine 1 (1 opens))  clicked 2 (5 clicks)  unsubscribed 0"
        ),
        "{text}"
    );
    assert!(
        text.contains("1         3  https://shop.example/a?x=1&y=2"),
        "{text}"
    );
    assert!(
        text.contains("2         2  https://shop.example/b"),
        "{text}"
    );

    let page = http("GET", serve.admin, &format!("/campaigns/{id}"), &[], None);
    assert_eq!(page.status, 200, "{}", page.body);
    let sum = |class: &str| -> i64 {
        crate::charts::bars(&page.body, class)
            .iter()
            .map(|b| b.1)
            .sum()
    };
    assert_eq!(sum("opens"), ledger.opened, "{}", page.body);
    assert_eq!(sum("clicks"), ledger.clicked, "{}", page.body);
    assert_eq!(sum("sent"), 4);
    let table = &page.body[page
        .body
        .find("<table class=\"link-clicks\"")
        .expect("no link table")..];
    assert!(
        table.contains("data-link=\"1\"><td class=\"num\">1</td><th scope=\"row\" class=\"num\">1</th><td class=\"url\"><code>https://shop.example/a?x=1&#38;y=2</code></td><td class=\"num clicks\">3</td>"),
        "{table}"
    );
    assert!(
        table.contains("<code>https://shop.example/b</code></td><td class=\"num clicks\">2</td>"),
        "{table}"
    );

    // An untracked campaign: `tracking` null, no opens or clicks shown.
    create(&env, "plain", &base, &[]);
    let plain = env.status("plain")["id"].as_i64().unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&env.ok(&["report", "plain", "--json"])).unwrap();
    assert!(r["tracking"].is_null(), "{r}");
    let page = http(
        "GET",
        serve.admin,
        &format!("/campaigns/{plain}"),
        &[],
        None,
    );
    assert_eq!(page.status, 200);
    for absent in ["chart opens", "chart clicks", "link-clicks"] {
        assert!(!page.body.contains(absent), "{absent}: {}", page.body);
    }
}

#[test]
fn report_and_page_show_engagement_sqlite() {
    report_and_page_show_engagement(Kind::Sqlite);
}

#[test]
fn report_and_page_show_engagement_pg() {
    report_and_page_show_engagement(Kind::Postgres);
}
