//! The subscribers' own pages (issue 38 items 2–3): the built-in
//! confirmation mail, the `/p/TOKEN` preference centre and the `/v/TOKEN`
//! view in browser, against the real binary (serve and workers),
//! beanstalkd, a recording SMTP peer, SQLite and PostgreSQL.

use std::time::Duration;

use crate::util::*;

/// Where the messages' links point; requests go to the test's listener.
const PUBLIC: &str = "http://127.0.0.1:9";

/// (status, body) of a request to the public listener.
fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("{e}"),
    }
}

fn get(port: u16, path: &str) -> (u16, String) {
    answer(
        ureq::get(&format!("http://127.0.0.1:{port}{path}"))
            .timeout(Duration::from_secs(10))
            .call(),
    )
}

fn post(port: u16, path: &str, fields: &[(&str, &str)]) -> (u16, String) {
    answer(
        ureq::post(&format!("http://127.0.0.1:{port}{path}"))
            .timeout(Duration::from_secs(10))
            .send_form(fields),
    )
}

/// A world whose peer keeps what it accepts, with a public URL.
fn world(kind: Kind) -> World {
    let script = Script {
        keep_data: true,
        ..Script::default()
    };
    World::with_peer(kind, script).var("MAILSPLIT_PUBLIC_URL", PUBLIC)
}

/// The messages the peer accepted for `to` so far (their text).
fn mails_to(env: &World, to: &str) -> Vec<String> {
    env.peer()
        .messages
        .lock()
        .unwrap()
        .iter()
        .filter(|(rcpts, _)| rcpts.iter().any(|r| r == to))
        .map(|(_, m)| m.clone())
        .collect()
}

/// Wait for the `n`th message to `to` and return it.
fn wait_mail(env: &World, to: &str, n: usize) -> String {
    wait_for(30, &format!("mail #{n} to {to}"), || {
        mails_to(env, to).len() >= n
    });
    mails_to(env, to)[n - 1].clone()
}

/// The path of the first `PUBLIC/<route>/…` link in `text` (HTML
/// entities decoded: the HTML part escapes `/`).
fn link(text: &str, route: &str) -> String {
    let text = &text.replace("&#x2f;", "/").replace("&amp;", "&");
    let start = format!("{PUBLIC}/{route}/");
    let at = text
        .find(&start)
        .unwrap_or_else(|| panic!("no {start} link in:\n{text}"));
    let rest = &text[at + PUBLIC.len()..];
    let end = rest
        .find(|c: char| c.is_whitespace() || "\"<>'".contains(c))
        .unwrap_or(rest.len());
    rest[..end].to_string()
}

fn members(env: &Env, list: &str) -> String {
    let out = env.ok(&["list", "ls"]);
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(list))
        .unwrap_or_else(|| panic!("no line for {list}:\n{out}"))
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

/// No `confirm` template: the built-in mail goes out, names the list and
/// carries a `/confirm/` link whose POST (not its GET) makes the member.
fn builtin_confirmation_mail(kind: Kind) {
    let env = world(kind);
    env.ok(&["migrate"]);
    env.ok(&[
        "list",
        "create",
        "weekly",
        "--title",
        "The Weekly <Letter>",
        "--public",
        "--double-opt-in",
    ]);
    let served = env.serve(None);
    let w = env.worker(&[]);
    let (code, page) = post(
        served.public,
        "/subscribe",
        &[
            ("email", "ann@example.test"),
            ("name", "Ann"),
            ("list", "weekly"),
        ],
    );
    assert_eq!(code, 200, "{page}");
    let mail = wait_mail(&env, "ann@example.test", 1);
    let p = parts(&mail);
    assert_eq!(p.subject, "Please confirm your subscription");
    assert!(p.html.contains("The Weekly &lt;Letter&gt;"), "{}", p.html);
    assert!(p.text.contains("The Weekly <Letter>"), "{}", p.text);
    assert!(p.text.contains("Hello Ann"), "{}", p.text);
    assert_eq!(header(&mail, "From"), ["no-reply@localhost"]);
    let path = link(&p.text, "confirm");
    assert_eq!(link(&p.html, "confirm"), path);

    assert_eq!(get(served.public, &path).0, 200);
    assert_eq!(members(&env, "weekly"), "0");
    let (code, page) = post(served.public, &path, &[]);
    assert_eq!(code, 200, "{page}");
    assert_eq!(members(&env, "weekly"), "1");

    // The user's own `confirm` template overrides the built-in one.
    let html = env.dir.path().join("confirm.html");
    std::fs::write(
        &html,
        "<p>Ours: <a href=\"{{ data.confirm_url }}\">go</a></p>\n",
    )
    .unwrap();
    env.ok(&[
        "template",
        "create",
        "confirm",
        "--subject",
        "Our own confirmation",
        "--from",
        "shop@example.test",
        "--html",
        html.to_str().unwrap(),
    ]);
    post(
        served.public,
        "/subscribe",
        &[("email", "bob@example.test"), ("list", "weekly")],
    );
    let mail = wait_mail(&env, "bob@example.test", 1);
    let p = parts(&mail);
    assert_eq!(p.subject, "Our own confirmation");
    assert_eq!(header(&mail, "From"), ["shop@example.test"]);
    let path = link(&p.html, "confirm");
    assert_eq!(post(served.public, &path, &[]).0, 200);
    assert_eq!(members(&env, "weekly"), "2");
    stop_worker(w);
}

both!(builtin_confirmation_mail);
