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
    created_with_warnings(&served, &cookie, &r);

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

/// The stage's warnings (`serve` has no public URL, example.test no DKIM
/// key) go with the redirect, are shown once on the draft's page, in
/// `campaign create`'s words, and cannot be forged.
fn created_with_warnings(served: &Served, session: &str, created: &Http) {
    let page_path = created.header("location").unwrap();
    let flash = created
        .headers
        .iter()
        .find_map(|(k, v)| {
            let v = v.strip_prefix("mailsplit_flash=")?;
            k.eq_ignore_ascii_case("set-cookie").then_some(v)
        })
        .expect("the warnings' cookie");
    assert!(flash.contains(&format!("Path={page_path};")), "{flash}");
    let value = flash.split(';').next().unwrap();
    let visit = |path: &str, value: &str| {
        let cookie = format!("{session}; mailsplit_flash={value}");
        http("GET", served.admin, path, &[("Cookie", &cookie)], None)
    };
    let page = visit(page_path, value);
    assert_eq!(page.status, 200, "{}", page.body);
    for said in [
        "Created, with warnings",
        "one-click unsubscribe (RFC 8058)",
        "example.test has no DKIM key",
    ] {
        assert!(page.body.contains(said), "{said}: {}", page.body);
    }
    let cleared = page.headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("set-cookie")
            && v.starts_with("mailsplit_flash=;")
            && v.contains("Max-Age=0")
    });
    assert!(cleared, "{:?}", page.headers);
    // Without the cookie, nothing; a changed one fails its MAC.
    let again = http("GET", served.admin, page_path, &[("Cookie", session)], None);
    assert!(!again.body.contains("with warnings"), "{}", again.body);
    let (payload, tag) = value.split_once('.').unwrap();
    let forged = format!("{}.{tag}", &payload[..payload.len() - 2]);
    assert!(!visit(page_path, &forged).body.contains("with warnings"));
}

/// The campaign page's forms, each through the CLI's stage: preview for a
/// chosen member, a test send (`[TEST]` at the relay, nothing in the
/// ledger), the edit's refusals beside their field, schedule (enqueued,
/// delayed until the start), pause, edit, resume and cancel from the
/// page, back to the page each time; an edit of a cancelled campaign is
/// refused in `campaign edit`'s words.
fn campaign_page_forms(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    let (served, cookie, csrf) = logged_in(&env);
    let fields = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        let mut f: Vec<_> = pairs.iter().map(|(k, v)| (*k, v.to_string())).collect();
        f.push(("csrf", csrf.clone()));
        f
    };
    let new = fields(&[
        ("name", "spring"),
        ("list", "news"),
        ("subject", "Spring is here"),
        ("from", "shop@example.test"),
        ("format", "markdown"),
        ("content", MARKDOWN),
    ]);
    let r = post(&served, &cookie, "/campaigns/new", &new);
    assert_eq!(r.status, 303, "{}", r.body);
    let page_path = r.header("location").unwrap().to_string();
    let get = |path: &str| http("GET", served.admin, path, &[("Cookie", &cookie)], None);

    // A draft: its forms, no empty charts, previewed for a chosen member.
    let page = get(&page_path);
    assert_eq!(page.status, 200, "{}", page.body);
    for needle in [
        "action=\"/campaigns/spring/send\"",
        "action=\"/campaigns/spring/test\"",
        "href=\"/campaigns/spring/edit\"",
        "No sends yet.",
    ] {
        assert!(page.body.contains(needle), "{needle}: {}", page.body);
    }
    assert!(!page.body.contains("00:00–00:00"), "{}", page.body);
    assert!(
        !page.body.contains("<figure class=\"chart"),
        "{}",
        page.body
    );
    let csp = page.header("content-security-policy").unwrap();
    assert!(
        csp.contains("form-action 'self'") && !csp.contains("script-src"),
        "{csp}"
    );
    let cid = get(&format!("{page_path}?member=cid%40example.test"));
    assert!(
        cid.body
            .contains("Rendered for <code>cid@example.test</code>"),
        "{}",
        cid.body
    );
    assert!(cid.body.contains("Hello Cid"), "{}", cid.body);
    let nobody = get(&format!("{page_path}?member=nobody%40example.test"));
    assert!(
        nobody.body.contains("class=\"error no-preview\""),
        "{}",
        nobody.body
    );

    // A test send: forged refused; the real one reaches the relay only.
    let test = fields(&[("to", "qa@test.example"), ("recipient", "bob@example.test")]);
    let mut forged = test.clone();
    forged.pop();
    assert_eq!(
        post(&served, &cookie, "/campaigns/spring/test", &forged).status,
        403
    );
    let r = post(&served, &cookie, "/campaigns/spring/test", &test);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("sent a test message to qa@test.example"),
        "{}",
        r.body
    );
    let got = peer.messages.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    let m = parts(&got[0].1);
    assert_eq!(m.subject, "[TEST] Spring is here");
    assert!(m.text.contains("Hello Bob"), "{}", m.text);
    assert_eq!(env.status("spring")["sent"], 0);

    // Edit: the current subject and From shown; the stage's refusal
    // beside its field, then a good edit.
    let form = get("/campaigns/spring/edit");
    assert!(
        form.body.contains("placeholder=\"Spring is here\""),
        "{}",
        form.body
    );
    assert!(
        form.body.contains("placeholder=\"shop@example.test\""),
        "{}",
        form.body
    );
    assert_eq!(get("/campaigns/nope/edit").status, 404);
    let r = post(
        &served,
        &cookie,
        "/campaigns/spring/edit",
        &fields(&[("send_at", "soon")]),
    );
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("id=\"e-send_at\""), "{}", r.body);
    let r = post(
        &served,
        &cookie,
        "/campaigns/spring/edit",
        &fields(&[("subject", "Spring, at last")]),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(get(&page_path)
        .body
        .contains("<strong>Spring, at last</strong>"));

    // Schedule: enqueued, delayed until its start.
    let start = mailsplit::store::now_ms() + 3_600_000;
    let start =
        mailsplit::clock::rfc3339(start - start % 1000, mailsplit::clock::Precision::AsNeeded);
    let r = post(
        &served,
        &cookie,
        "/campaigns/spring/send",
        &fields(&[("send_at", &start)]),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some(page_path.as_str()));
    wait_for(30, "the enqueue", || env.status("spring")["enqueued"] == 3);
    let s = env.status("spring");
    assert_eq!(
        (s["state"].as_str(), s["send_at"].as_str()),
        (Some("scheduled"), Some(start.as_str()))
    );

    // Pause, edit, resume and cancel from the page, back to it each time.
    let control = |action: &str| {
        let r = post(
            &served,
            &cookie,
            &format!("/campaigns/spring/{action}"),
            &fields(&[("back", "page")]),
        );
        assert_eq!(r.status, 303, "{action}: {}", r.body);
        assert_eq!(r.header("location"), Some(page_path.as_str()));
    };
    assert!(get(&page_path)
        .body
        .contains("action=\"/campaigns/spring/pause\""));
    // Cancel, for good, sits behind a second step (no script needed).
    let page = get(&page_path).body;
    let confirm = page.find("<details class=\"confirm\"><summary>Cancel…</summary>");
    let cancel = page.find("action=\"/campaigns/spring/cancel\"");
    assert!(confirm.is_some() && confirm < cancel, "{page}");
    control("pause");
    assert_eq!(env.status("spring")["state"], "paused");
    let r = post(
        &served,
        &cookie,
        "/campaigns/spring/edit",
        &fields(&[("subject", "Spring, fixed")]),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    control("resume");
    control("cancel");
    assert_eq!(env.status("spring")["state"], "cancelled");
    let page = get(&page_path);
    assert!(
        !page.body.contains("nothing leaves before"),
        "{}",
        page.body
    );
    assert!(
        !page.body.contains("/campaigns/spring/send\""),
        "{}",
        page.body
    );
    let r = post(
        &served,
        &cookie,
        "/campaigns/spring/edit",
        &fields(&[("subject", "Too late")]),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.body.contains("there is nothing left to send an edit to"),
        "{}",
        r.body
    );
    assert_eq!(env.status("spring")["sent"], 0);
}

/// Archive: refused in the stage's words while the campaign may still
/// send; a finished one leaves the dashboard's list (and only that: the
/// API and `status` still show it), is listed under "Archived
/// campaigns", and comes back.
fn archive_hides_a_finished_campaign(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    let (served, cookie, csrf) = logged_in(&env);
    env.create_campaign("old", "news", &[]);
    env.create_campaign("new", "news", &[]);
    let archive = |name: &str| {
        post(
            &served,
            &cookie,
            &format!("/campaigns/{name}/archive"),
            &[("csrf", csrf.clone())],
        )
    };
    let dashboard = || http("GET", served.admin, "/", &[("Cookie", &cookie)], None).body;
    let r = archive("old");
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(
        r.body
            .contains("only a finished (done or cancelled) campaign can be archived"),
        "{}",
        r.body
    );
    env.ok(&["cancel", "old"]);
    assert!(dashboard().contains("action=\"/campaigns/old/archive\""));
    assert!(!dashboard().contains("action=\"/campaigns/new/archive\""));
    assert_eq!(archive("old").status, 303);
    let d = dashboard();
    assert!(!d.contains("data-campaign=\"old\""), "{d}");
    assert!(d.contains("data-campaign=\"new\""), "{d}");
    assert!(d.contains("Archived campaigns (1)"), "{d}");
    assert_eq!(env.status("old")["state"], "cancelled");
    let list = http(
        "GET",
        served.admin,
        "/campaigns/archived",
        &[("Cookie", &cookie)],
        None,
    );
    assert!(list.body.contains("data-campaign=\"old\""), "{}", list.body);
    assert!(
        !list.body.contains("data-campaign=\"new\""),
        "{}",
        list.body
    );
    let r = post(
        &served,
        &cookie,
        "/campaigns/old/unarchive",
        &[("csrf", csrf.clone())],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(dashboard().contains("data-campaign=\"old\""));
    // Without the CSRF token: nothing.
    env.ok(&["cancel", "new"]);
    assert_eq!(
        post(&served, &cookie, "/campaigns/new/archive", &[]).status,
        403
    );
    assert!(dashboard().contains("data-campaign=\"new\""));
}

/// A `multipart/form-data` body of `fields` and one file `upload`.
fn multipart(fields: &[(&str, String)], file: (&str, &[u8])) -> (String, Vec<u8>) {
    let boundary = "----mailsplitTestBoundary7";
    let mut body = Vec::new();
    for (k, v) in fields {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"upload\"; filename=\"{}\"\r\nContent-Type: application/octet-stream\r\n\r\n",
            file.0
        )
        .as_bytes(),
    );
    body.extend_from_slice(file.1);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Content uploaded as a file (as the form's file input sends it): HTML
/// by its name, the CSRF token read from the multipart body, a file that
/// is not text refused beside the content.
fn upload_a_file(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    let (served, cookie, csrf) = logged_in(&env);
    let send = |fields: &[(&str, String)], file: (&str, &[u8])| {
        let (ct, body) = multipart(fields, file);
        let agent = ureq::AgentBuilder::new().redirects(0).build();
        let url = format!("http://127.0.0.1:{}/campaigns/new", served.admin);
        let r = agent
            .post(&url)
            .set("Cookie", &cookie)
            .set("Content-Type", &ct)
            .send_bytes(&body);
        match r {
            Ok(r) | Err(ureq::Error::Status(_, r)) => (r.status(), r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    let mut fields: Vec<(&str, String)> = [
        ("name", "upload"),
        ("list", "news"),
        ("subject", "Uploaded"),
        ("from", "shop@example.test"),
        ("format", "markdown"),
        ("content", ""),
    ]
    .iter()
    .map(|(k, v)| (*k, v.to_string()))
    .collect();
    let html: &[u8] = b"<html><body><p>Uploaded for {{ email }}</p></body></html>";
    assert_eq!(send(&fields, ("page.html", html)).0, 403, "no CSRF field");
    fields.push(("csrf", csrf.clone()));
    let (status, body) = send(&fields, ("bad.md", &[0xff, 0xfe, 0x00, 0x41]));
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("<p class=\"error\" id=\"e-content\">"),
        "{body}"
    );
    assert!(
        body.contains("the uploaded file &#34;bad.md&#34; is not UTF-8 text"),
        "{body}"
    );
    let (status, body) = send(&fields, ("page.html", html));
    assert_eq!(status, 303, "{body}");
    let page_path = format!("/campaigns/{}", env.status("upload")["id"]);
    let page = http(
        "GET",
        served.admin,
        &page_path,
        &[("Cookie", &cookie)],
        None,
    );
    assert!(page.body.contains("<td>html</td>"), "{}", page.body);
    assert!(
        page.body.contains("Uploaded for ann@example.test"),
        "{}",
        page.body
    );
}

both!(
    new_campaign_form,
    campaign_page_forms,
    archive_hides_a_finished_campaign,
    upload_a_file
);
