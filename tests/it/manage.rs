//! The dashboard's management pages over real HTTP, on both databases:
//! each form does what its CLI command does (checked with the CLI), a
//! refusal is the stage's own sentence next to the form (422), a secret
//! is shown once and never again, and no POST works without the
//! session's CSRF token.

use crate::admin::{csrf_of, login, TOKEN};
use crate::util::*;

/// A logged-in browser: its cookie and the CSRF token of its pages.
pub(crate) struct Browser {
    port: u16,
    pub(crate) cookie: String,
    csrf: String,
}

impl Browser {
    pub(crate) fn new(port: u16) -> Browser {
        let cookie = login(port);
        let page = http("GET", port, "/apikeys", &[("Cookie", &cookie)], None);
        assert_eq!(page.status, 200, "{}", page.body);
        let csrf = csrf_of(&page.body);
        Browser { port, cookie, csrf }
    }

    pub(crate) fn get(&self, path: &str) -> Http {
        http("GET", self.port, path, &[("Cookie", &self.cookie)], None)
    }

    /// POST `fields` as a form, with the CSRF token.
    pub(crate) fn post(&self, path: &str, fields: &[(&str, &str)]) -> Http {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("csrf", &self.csrf);
        form.extend_pairs(fields);
        let body = form.finish();
        http(
            "POST",
            self.port,
            path,
            &[("Cookie", &self.cookie)],
            Some(&body),
        )
    }
}

/// The text of the first `<code class="secret" …>` on a page.
pub(crate) fn secret_of(page: &str) -> String {
    let at = page.find("class=\"secret\"").expect("a secret shown") + 14;
    let rest = &page[at..];
    let start = rest.find('>').unwrap() + 1;
    rest[start..].split('<').next().unwrap().to_string()
}

fn api_keys_are_shown_once_and_revoked(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    assert!(b.get("/apikeys").body.contains("No API keys yet"));

    let made = b.post(
        "/apikeys",
        &[("name", "shop"), ("scope", "read"), ("scope", "send")],
    );
    assert_eq!(made.status, 200, "{}", made.body);
    let key = secret_of(&made.body);
    assert!(key.starts_with("ms_"), "{key}");
    let with_key = format!("Bearer {key}");
    let api = |h: &str| {
        http(
            "GET",
            s.admin,
            "/api/v1/campaigns",
            &[("Authorization", h)],
            None,
        )
    };
    assert_eq!(api(&with_key).status, 200, "the shown key works");

    // Listed as `apikey ls` lists it, and the key never again.
    let list = b.get("/apikeys");
    assert!(list.body.contains("data-key=\"shop\""), "{}", list.body);
    assert!(list.body.contains("read,send") || list.body.contains("send,read"));
    assert!(!list.body.contains(&key), "the key is shown once only");
    assert!(env.ok(&["apikey", "ls"]).contains("shop"));

    // The stage's refusals, next to the form, the name kept.
    let twice = b.post("/apikeys", &[("name", "shop"), ("scope", "read")]);
    assert_eq!(twice.status, 422, "{}", twice.body);
    assert!(twice.body.contains("exists already"), "{}", twice.body);
    assert!(twice.body.contains("value=\"shop\""));
    let none = b.post("/apikeys", &[("name", "other")]);
    assert_eq!(none.status, 422);
    assert!(none.body.contains("at least one scope"), "{}", none.body);
    let bad = b.post("/apikeys", &[("name", "a b"), ("scope", "read")]);
    assert_eq!(bad.status, 422);
    assert!(bad.body.contains("is not valid"), "{}", bad.body);

    let gone = b.post("/apikeys/shop/revoke", &[]);
    assert_eq!(gone.status, 303, "{}", gone.body);
    assert_eq!(api(&with_key).status, 401, "a revoked key is refused");
    let again = b.post("/apikeys/shop/revoke", &[]);
    assert_eq!(again.status, 422);
    assert!(again.body.contains("no API key named"), "{}", again.body);
}

fn webhooks_are_added_and_removed(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    let url = "http://127.0.0.1:9/hooks";

    let local = b.post("/webhooks", &[("url", url), ("events", "sent,failed")]);
    assert_eq!(local.status, 422, "{}", local.body);
    assert!(local.body.contains("loopback") || local.body.contains("local"));
    assert!(
        local.body.contains("value=\"http://127.0.0.1:9/hooks\""),
        "the form keeps the URL"
    );
    let unknown = b.post(
        "/webhooks",
        &[("url", url), ("events", "sent,nope"), ("allow_local", "on")],
    );
    assert_eq!(unknown.status, 422);
    assert!(
        unknown.body.contains("unknown webhook event"),
        "{}",
        unknown.body
    );
    assert!(env.ok(&["webhook", "ls"]).contains("no webhooks"));

    let added = b.post(
        "/webhooks",
        &[
            ("url", url),
            ("events", "sent,failed"),
            ("allow_local", "on"),
        ],
    );
    assert_eq!(added.status, 200, "{}", added.body);
    let secret = secret_of(&added.body);
    assert!(secret.len() >= 16, "{secret}");
    let ls = env.ok(&["webhook", "ls"]);
    assert!(ls.contains(url), "{ls}");
    let id = ls.split_whitespace().next().unwrap().to_string();
    let list = b.get("/webhooks");
    assert!(
        list.body.contains(&format!("data-webhook=\"{id}\"")),
        "{}",
        list.body
    );
    assert!(
        !list.body.contains(&secret),
        "the secret is shown once only"
    );

    // A given secret is not echoed.
    let given = b.post(
        "/webhooks",
        &[
            ("url", url),
            ("events", "sent"),
            ("secret", "s3cret-given"),
            ("allow_local", "on"),
        ],
    );
    assert_eq!(given.status, 200, "{}", given.body);
    assert!(!given.body.contains("s3cret-given"));

    let removed = b.post(&format!("/webhooks/{id}/remove"), &[]);
    assert_eq!(removed.status, 303, "{}", removed.body);
    assert!(!env.ok(&["webhook", "ls"]).contains(&format!("{id}  ")));
    let again = b.post(&format!("/webhooks/{id}/remove"), &[]);
    assert_eq!(again.status, 422);
    assert!(
        again.body.contains(&format!("no webhook {id}")),
        "{}",
        again.body
    );
}

fn suppression_is_added_removed_imported_and_paged(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);

    let added = b.post(
        "/suppression",
        &[
            ("entries", "Ada@Example.com, @spam.example"),
            ("reason", "asked by phone"),
        ],
    );
    assert_eq!(added.status, 303, "{}", added.body);
    let ls = env.ok(&["suppress", "ls"]);
    assert!(
        ls.contains("ada@example.com") && ls.contains("@spam.example"),
        "{ls}"
    );
    assert!(ls.contains("asked by phone"));
    let page = b.get("/suppression");
    assert!(
        page.body.contains("data-entry=\"@spam.example\""),
        "{}",
        page.body
    );

    let bad = b.post(
        "/suppression",
        &[("entries", "ada@example.com not-an-address")],
    );
    assert_eq!(bad.status, 422);
    assert!(
        bad.body.contains("neither an address nor @domain"),
        "{}",
        bad.body
    );

    let removed = b.post("/suppression/remove", &[("entry", "@spam.example")]);
    assert_eq!(removed.status, 303);
    assert!(!env.ok(&["suppress", "ls"]).contains("@spam.example"));

    // Import: what `suppress import` says, bad lines named; then pages.
    let mut file = String::from("email,name\n");
    for i in 0..150 {
        file.push_str(&format!("p{i:03}@import.example,P\n"));
    }
    file.push_str("nonsense,X\n");
    let imported = b.post(
        "/suppression/import",
        &[("file", &file), ("reason", "old list")],
    );
    assert_eq!(imported.status, 200, "{}", imported.body);
    assert!(
        imported
            .body
            .contains("read 150 entries: 150 added, 0 already on the list, 1 bad lines skipped"),
        "{}",
        imported.body
    );
    let first = b.get("/suppression");
    assert_eq!(first.body.matches("data-entry=").count(), 100);
    let at = first.body.find("rel=\"next\"").expect("a next page");
    let href = first.body[..at]
        .rsplit("href=\"")
        .next()
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let second = b.get(&href.replace("&amp;", "&"));
    assert_eq!(second.status, 200);
    // 151 entries: 100, then 51, none twice.
    assert_eq!(
        second.body.matches("data-entry=").count(),
        51,
        "{}",
        second.body
    );
    assert!(!second.body.contains("rel=\"next\""));
    assert!(
        first.body.contains("p000@import.example") && second.body.contains("p149@import.example")
    );
}

fn every_form_refuses_a_post_without_the_csrf_token(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    env.ok(&["apikey", "create", "kept", "--scopes", "read"]);
    let posts = [
        ("/apikeys", "name=forged&scope=read"),
        ("/apikeys/kept/revoke", ""),
        ("/webhooks", "url=https%3A%2F%2Fevil.example%2F&events=sent"),
        ("/suppression", "entries=forged%40example.com"),
        ("/suppression/import", "file=forged%40example.com"),
    ];
    refuse_forged_posts(&b, &posts);
    assert!(env.ok(&["apikey", "ls"]).contains("kept"));
    assert!(!env.ok(&["apikey", "ls"]).contains("forged"));
    assert!(env.ok(&["webhook", "ls"]).contains("no webhooks"));
    assert!(env.ok(&["suppress", "ls"]).contains("is empty"));
}

/// Each of `posts` (path, form body) sent in the browser's session without
/// a CSRF token and with a forged one: 403 every time.
pub(crate) fn refuse_forged_posts(b: &Browser, posts: &[(&str, &str)]) {
    for (path, body) in posts {
        for csrf in ["", "&csrf=AAAAAAAAAAAAAAAAAAAAAAAA"] {
            let r = http(
                "POST",
                b.port,
                path,
                &[("Cookie", &b.cookie)],
                Some(&format!("{body}{csrf}")),
            );
            assert_eq!(r.status, 403, "{path} {csrf}: {}", r.body);
        }
    }
}

/// Flow `onboarding` on `list`: one step, template `welcome`, a day after
/// joining.
pub(crate) fn onboarding_flow(env: &Env, list: &str) {
    let html = env.dir.path().join("welcome.html");
    std::fs::write(&html, "<p>Welcome!</p>").unwrap();
    env.ok(&[
        "template",
        "create",
        "welcome",
        "--subject",
        "Hi",
        "--from",
        "shop@example.test",
        "--html",
        html.to_str().unwrap(),
        "--stream",
        "marketing",
    ]);
    env.ok(&[
        "flow",
        "create",
        "onboarding",
        "--list",
        list,
        "--trigger",
        "join",
        "--step",
        "1d:welcome",
    ]);
}

fn a_flow_is_paused_and_resumed_from_its_page(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    env.ok(&["list", "create", "news"]);
    onboarding_flow(&env, "news");
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    let state = || env.ok(&["flow", "ls"]);
    assert!(b.get("/flows/onboarding").body.contains(">Pause</button>"));

    let paused = b.post("/flows/onboarding/pause", &[]);
    assert_eq!(paused.status, 303, "{}", paused.body);
    assert!(state().contains("paused"), "{}", state());
    assert!(b.get("/flows/onboarding").body.contains(">Resume</button>"));
    let twice = b.post("/flows/onboarding/pause", &[]);
    assert_eq!(twice.status, 409, "{}", twice.body);
    assert!(twice.body.contains("already paused"), "{}", twice.body);

    assert_eq!(b.post("/flows/onboarding/resume", &[]).status, 303);
    assert!(!state().contains("paused"), "{}", state());
    let unknown = b.post("/flows/nope/pause", &[]);
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let forged = http(
        "POST",
        s.admin,
        "/flows/onboarding/pause",
        &[("Cookie", &b.cookie)],
        Some(""),
    );
    assert_eq!(forged.status, 403);
    assert!(!state().contains("paused"));
}

both!(
    a_flow_is_paused_and_resumed_from_its_page,
    api_keys_are_shown_once_and_revoked,
    webhooks_are_added_and_removed,
    suppression_is_added_removed_imported_and_paged,
    every_form_refuses_a_post_without_the_csrf_token,
);
