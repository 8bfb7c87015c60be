//! The dashboard's campaign forms over real HTTP, logged in with a browser
//! session: a CSRF-less or forged POST changes nothing; a refusal of the
//! campaign stage (the same words as `campaign create` and the API) comes
//! back beside its field with the form filled in again; a good form makes
//! the draft the CLI would have made.

use crate::admin::{csrf_of, login, TOKEN};
use crate::util::*;

/// A list `news` of three members, and `serve` logged in: the session's
/// cookie and the form's CSRF token.
fn logged_in(env: &Env) -> (Served, String, String) {
    let csv = "email,name\nann@example.test,Ann\nbob@example.test,Bob\ncid@example.test,Cid\n";
    let path = env.dir.path().join("news.csv");
    std::fs::write(&path, csv).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", path.to_str().unwrap(), "--list", "news"]);
    let served = env.serve(Some(TOKEN));
    let cookie = login(served.admin);
    let page = http(
        "GET",
        served.admin,
        "/campaigns/new",
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(page.status, 200, "{}", page.body);
    let csrf = csrf_of(&page.body);
    (served, cookie, csrf)
}

/// A form body from its fields, URL-encoded.
pub fn form(fields: &[(&str, String)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields.iter().map(|(k, v)| (k, v.as_str())))
        .finish()
}

const MARKDOWN: &str =
    "# Spring news\n\nHello {{ name }}, [our shop](https://shop.example.test/) is open.\n";

fn post(served: &Served, cookie: &str, path: &str, fields: &[(&str, String)]) -> Http {
    http(
        "POST",
        served.admin,
        path,
        &[("Cookie", cookie)],
        Some(&form(fields)),
    )
}

fn new_campaign_form(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    let (served, cookie, csrf) = logged_in(&env);
    let blank = http(
        "GET",
        served.admin,
        "/campaigns/new",
        &[("Cookie", &cookie)],
        None,
    );
    // Every field has its label; the list is a choice of the lists.
    for id in [
        "f-name",
        "f-list",
        "f-subject",
        "f-from",
        "f-content",
        "f-starter",
        "f-priority",
    ] {
        assert!(
            blank.body.contains(&format!("<label for=\"{id}\"")),
            "{id}: {}",
            blank.body
        );
    }
    assert!(
        blank
            .body
            .contains("<option value=\"news\">news (3 active)</option>"),
        "{}",
        blank.body
    );
    assert!(!blank.body.to_ascii_lowercase().contains("<script"));

    // The fields of a good form for campaign `name`, with this CSRF token.
    let good = |name: &str, token: &str| -> Vec<(&'static str, String)> {
        [
            ("name", name),
            ("list", "news"),
            ("subject", "Spring is here"),
            ("from", "Shop <shop@example.test>"),
            ("format", "markdown"),
            ("content", MARKDOWN),
            ("starter", "newsletter"),
            ("priority", "5"),
            ("csrf", token),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect()
    };

    // No CSRF token, or another one: refused, nothing made.
    let mut bare = good("spring", "");
    bare.pop();
    assert_eq!(post(&served, &cookie, "/campaigns/new", &bare).status, 403);
    let forged = good("spring", "AAAAAAAAAAAAAAAAAAAAAAAA");
    assert_eq!(
        post(&served, &cookie, "/campaigns/new", &forged).status,
        403
    );
    // And no session at all: the login, not a campaign.
    let r = http(
        "POST",
        served.admin,
        "/campaigns/new",
        &[],
        Some(&form(&good("spring", &csrf))),
    );
    assert_eq!(r.status, 401);
    assert!(env.run(&["status", "spring", "--json"]).status.code() != Some(0));

    // The stage's refusals, beside their field, the form filled again.
    let mut unknown = good("spring", &csrf);
    unknown[1].1 = "nope".into();
    let r = post(&served, &cookie, "/campaigns/new", &unknown);
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("id=\"e-list\""), "{}", r.body);
    assert!(
        r.body.contains("value=\"Spring is here\""),
        "refilled: {}",
        r.body
    );
    assert!(r.body.contains("Hello {{ name }}"), "refilled: {}", r.body);
    let mut empty = good("spring", &csrf);
    empty[2].1 = " ".into();
    let r = post(&served, &cookie, "/campaigns/new", &empty);
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(
        r.body.contains(
            "<p class=\"error\" id=\"e-subject\">--subject must be one non-empty line</p>"
        ),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("aria-describedby=\"e-subject\""),
        "{}",
        r.body
    );
    let mut priority = good("spring", &csrf);
    priority[7].1 = "soon".into();
    let r = post(&served, &cookie, "/campaigns/new", &priority);
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("id=\"e-priority\""), "{}", r.body);
    // Tracking needs the public URL `serve` was not given.
    let mut track = good("spring", &csrf);
    track[6] = ("track_clicks", "on".into());
    let r = post(&served, &cookie, "/campaigns/new", &track);
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(
        r.body
            .contains("<p class=\"error\" id=\"e-track\">--track clicks needs --public-url"),
        "{}",
        r.body
    );
    assert!(env.run(&["status", "spring", "--json"]).status.code() != Some(0));

    // A good form: the draft, on its page.
    let r = post(&served, &cookie, "/campaigns/new", &good("spring", &csrf));
    assert_eq!(r.status, 303, "{}", r.body);
    let s = env.status("spring");
    assert_eq!(
        r.header("location"),
        Some(format!("/campaigns/{}", s["id"]).as_str())
    );
    assert_eq!(s["state"], "draft");
    assert_eq!(s["recipients"], 3);
    let page = http(
        "GET",
        served.admin,
        r.header("location").unwrap(),
        &[("Cookie", &cookie)],
        None,
    );
    assert!(page.body.contains("Spring is here"), "{}", page.body);
    assert!(page.body.contains("markdown"), "{}", page.body);

    // The same name again: the stage's words, beside the name.
    let r = post(&served, &cookie, "/campaigns/new", &good("spring", &csrf));
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.body.contains("campaign &#34;spring&#34; already exists")
            || r.body
                .contains("campaign &quot;spring&quot; already exists"),
        "{}",
        r.body
    );
    assert!(r.body.contains("id=\"e-name\""), "{}", r.body);
}

both!(new_campaign_form);
