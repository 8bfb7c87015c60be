//! The dashboard's subscriber pages over real HTTP (`mailsplit serve`,
//! login session) against SQLite and PostgreSQL: the search finds by a
//! prefix in any case and pages through every match exactly once; a
//! person's page shows their lists, attributes, ledger, engagement and
//! complaints; unsubscribe, remove from a list and forget need the
//! page's CSRF token and do what the CLI does (the store checked).

use mailsplit::store::subscribers::{self, Subscriber};

use crate::admin::{csrf_of, login, TOKEN};
use crate::util::*;

/// As imported; stored with its domain in lower case.
const ZOE_IN: &str = "Zoe.Mixed@Example.TEST";
const ZOE: &str = "Zoe.Mixed@example.test";
const ZOE_PATH: &str = "/subscribers/Zoe.Mixed%40example.test";

/// 120 `userN@example.test` on `news`; Zoe, and user5 too, on `vip`; a
/// campaign `news` whose message to Zoe failed, was opened and clicked
/// and brought a complaint.
fn world(kind: Kind) -> World {
    let env = World::new(kind);
    env.import_n("news", 120);
    let vip = env.dir.path().join("vip.csv");
    std::fs::write(
        &vip,
        format!("email,name,city\n{ZOE_IN},Zoe Quill,Paris\nuser5@example.test,User 5,City 5\n"),
    )
    .unwrap();
    env.ok(&["import", vip.to_str().unwrap(), "--list", "vip"]);
    env.create_campaign("news", "news", &[]);
    let zoe = "(SELECT id FROM recipients WHERE email_key = 'zoe.mixed@example.test')";
    let news = "(SELECT id FROM campaigns WHERE name = 'news')";
    env.sql(&format!(
        "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, last_error, updated_at) \
         VALUES ({news}, {zoe}, 'failed', 1, '550 5.1.1 mailbox unavailable', 1700000000000);\n\
         INSERT INTO engagement (campaign_id, recipient_id, opens, clicks) VALUES ({news}, {zoe}, 3, 2);\n\
         INSERT INTO bounces (recipient_id, campaign_id, email, kind, status, reason, source, fingerprint, received_at) \
         VALUES ({zoe}, {news}, 'zoe.mixed@example.test', 'complaint', NULL, 'abuse report', 'report', 'fp1', 1700000001000);"
    ));
    env
}

fn find(env: &Env, email: &str) -> Option<Subscriber> {
    let key = mailsplit::mailbox::key(email).unwrap();
    subscribers::find(&mut env.conn(), &key).unwrap()
}

/// The addresses a results page links to, in order.
fn hits(page: &str) -> Vec<String> {
    page.split("<td class=\"name\"><a href=\"/subscribers/")
        .skip(1)
        .map(|s| {
            s.split('>')
                .nth(1)
                .unwrap()
                .split('<')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn get(port: u16, cookie: &str, path: &str) -> Http {
    let r = http("GET", port, path, &[("Cookie", cookie)], None);
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    r
}

fn search_finds_by_prefix_and_pages(kind: Kind) {
    let env = world(kind);
    let s = env.serve(Some(TOKEN));
    let cookie = login(s.admin);
    // Any case, the typed prefix folded as the address's key is.
    let r = get(s.admin, &cookie, "/subscribers?q=zOE.mixed%40EXAMPLE");
    assert_eq!(hits(&r.body), vec![ZOE.to_string()], "{}", r.body);
    assert!(
        r.body.contains(&format!("href=\"{ZOE_PATH}\"")),
        "{}",
        r.body
    );
    let r = get(s.admin, &cookie, "/subscribers?q=USER11");
    // Key (byte) order: '@' sorts after the digits.
    let want: Vec<String> = [110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 11]
        .iter()
        .map(|i| format!("user{i}@example.test"))
        .collect();
    assert_eq!(hits(&r.body), want);
    assert!(!r.body.contains("rel=\"next\""));
    let r = get(s.admin, &cookie, "/subscribers?q=nobody");
    assert!(r.body.contains("No subscriber"), "{}", r.body);
    // 120 matches: pages of 50, 50 and 20, in key order, none twice.
    let mut all = Vec::new();
    let mut path = "/subscribers?q=user".to_string();
    let mut pages = 0;
    loop {
        let r = get(s.admin, &cookie, &path);
        let page = hits(&r.body);
        pages += 1;
        assert!(pages <= 3, "the pages do not end: {path}");
        all.extend(page);
        let Some(at) = r.body.find("rel=\"next\"") else {
            break;
        };
        let link = &r.body[..at];
        let start = link.rfind("href=\"").unwrap() + 6;
        path = link[start..]
            .split('"')
            .next()
            .unwrap()
            .replace("&#38;", "&")
            .replace("&amp;", "&");
    }
    assert_eq!(pages, 3);
    let mut want: Vec<String> = (1..=120).map(|i| format!("user{i}@example.test")).collect();
    want.sort();
    assert_eq!(all, want);
}

fn subscriber_page_shows_everything(kind: Kind) {
    let env = world(kind);
    let s = env.serve(Some(TOKEN));
    let cookie = login(s.admin);
    let page = get(s.admin, &cookie, ZOE_PATH).body;
    for want in [
        "Zoe Quill",
        "<dt>city</dt><dd>Paris</dd>",
        "data-list=\"vip\"",
        "data-campaign=\"news\"",
        "550 5.1.1 mailbox unavailable",
        "2023-11-14T22:13:20Z",
        "<td class=\"num opens\">3</td>",
        "<td class=\"num clicks\">2</td>",
        "<td>complaint</td>",
        "abuse report",
        "action=\"/subscribers/Zoe.Mixed%40example.test/unsubscribe\"",
    ] {
        assert!(page.contains(want), "{want} missing: {page}");
    }
    // Any spelling of the address finds the page; an unknown one is 404.
    let r = http(
        "GET",
        s.admin,
        "/subscribers/zoe.mixed%40example.test",
        &[("Cookie", cookie.as_str())],
        None,
    );
    assert_eq!(r.status, 200);
    let r = http(
        "GET",
        s.admin,
        "/subscribers/nobody%40example.test",
        &[("Cookie", cookie.as_str())],
        None,
    );
    assert_eq!(r.status, 404);
    // Without a session: the login, not the page.
    assert_eq!(http("GET", s.admin, ZOE_PATH, &[], None).status, 401);
}

fn actions_need_csrf_and_do_what_the_cli_does(kind: Kind) {
    let env = world(kind);
    let s = env.serve(Some(TOKEN));
    let cookie = login(s.admin);
    let csrf = csrf_of(&get(s.admin, &cookie, ZOE_PATH).body);
    let post = |path: &str, body: &str| {
        http(
            "POST",
            s.admin,
            path,
            &[("Cookie", cookie.as_str())],
            Some(body),
        )
    };
    let unsubscribe = format!("{ZOE_PATH}/unsubscribe");
    let remove = format!("{ZOE_PATH}/remove");
    let forget = format!("{ZOE_PATH}/forget");
    // No token, or another's: refused, nothing changed.
    for body in ["", "csrf=AAAAAAAAAAAAAAAAAAAAAAAA"] {
        for path in [&unsubscribe, &forget] {
            assert_eq!(post(path, body).status, 403, "{path} {body:?}");
        }
        assert_eq!(post(&remove, &format!("{body}&list=vip")).status, 403);
    }
    let zoe = find(&env, ZOE).unwrap();
    assert_eq!(zoe.status.to_string(), "active");
    assert_eq!(zoe.lists, ["vip"]);

    let r = post(&unsubscribe, &format!("csrf={csrf}"));
    assert_eq!((r.status, r.header("location")), (303, Some(ZOE_PATH)));
    assert_eq!(find(&env, ZOE).unwrap().status.to_string(), "unsubscribed");
    let r = post(&remove, &format!("csrf={csrf}&list=vip"));
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(find(&env, ZOE).unwrap().lists.is_empty());
    assert_eq!(
        find(&env, "user5@example.test").unwrap().lists,
        ["news", "vip"]
    );
    let r = post(&remove, &format!("csrf={csrf}&list=no-such-list"));
    assert_eq!(r.status, 422, "{}", r.body);

    // Forget asks first: the page's button posts to the same path.
    let ask = get(s.admin, &cookie, &forget).body;
    assert!(ask.contains(&format!("action=\"{forget}\"")), "{ask}");
    assert!(find(&env, ZOE).is_some(), "asking forgets nothing");
    let r = post(&forget, &format!("csrf={}", csrf_of(&ask)));
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.header("location"),
        Some("/subscribers?forgotten=zoe.mixed%40example.test")
    );
    assert!(find(&env, ZOE).is_none());
    let r = http(
        "GET",
        s.admin,
        ZOE_PATH,
        &[("Cookie", cookie.as_str())],
        None,
    );
    assert_eq!(r.status, 404);
    let done = get(
        s.admin,
        &cookie,
        "/subscribers?forgotten=zoe.mixed%40example.test",
    );
    assert!(done.body.contains("was forgotten"), "{}", done.body);
    // As the CLI's forget: the address is blocked from coming back.
    env.ok(&[
        "import",
        env.dir.path().join("vip.csv").to_str().unwrap(),
        "--list",
        "vip",
    ]);
    assert!(find(&env, ZOE).is_none());
}

both!(
    search_finds_by_prefix_and_pages,
    subscriber_page_shows_everything,
    actions_need_csrf_and_do_what_the_cli_does,
);
