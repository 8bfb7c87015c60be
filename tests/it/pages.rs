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
pub(crate) fn world(kind: Kind) -> World {
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
pub(crate) fn link(text: &str, route: &str) -> String {
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

/// `first` sent on `news` to Ann and Bob; returns (Ann's mail, Bob's mail).
pub(crate) fn sent_to_both(env: &World) -> (String, String) {
    env.ok(&["migrate"]);
    for (list, face) in [
        ("news", "--public"),
        ("offers", "--public"),
        ("vip", "--private"),
    ] {
        env.ok(&[
            "list",
            "create",
            list,
            face,
            "--title",
            &format!("The {list}"),
        ]);
    }
    let csv = env.dir.path().join("people.csv");
    std::fs::write(
        &csv,
        "email,name\nann@example.test,Ann\nbob@example.test,Bob\n",
    )
    .unwrap();
    let csv = csv.to_str().unwrap();
    env.ok(&["import", csv, "--list", "news"]);
    env.ok(&["import", csv, "--list", "offers"]);
    let bob = env.dir.path().join("bob.csv");
    std::fs::write(&bob, "email,name\nbob@example.test,Bob\n").unwrap();
    env.ok(&["import", bob.to_str().unwrap(), "--list", "vip"]);
    let html = env.dir.path().join("letter.html");
    std::fs::write(
        &html,
        "<p>Hello {{ name }}!</p>\n<p><a href=\"{{ preferences_url }}\">Preferences</a> \
         <a href=\"{{ view_url }}\">View in browser</a> \
         <a href=\"https://shop.example.test/sale\">Sale</a></p>\n",
    )
    .unwrap();
    send(env, "first", "news", &html);
    (
        wait_mail(env, "ann@example.test", 1),
        wait_mail(env, "bob@example.test", 1),
    )
}

/// Create campaign `name` of `list` with `html`, send it, wait for the end.
fn send(env: &World, name: &str, list: &str, html: &std::path::Path) {
    env.ok(&[
        "campaign",
        "create",
        name,
        "--list",
        list,
        "--subject",
        "Letter for {{ name }}",
        "--from",
        "shop@example.test",
        "--html",
        html.to_str().unwrap(),
        "--track",
        "clicks",
    ]);
    env.ok(&["enqueue", name]);
    let before = env.workers().len();
    let w = env.worker(&[]);
    wait_done(env, name, 60);
    // A campaign nobody is left on is done at once: wait for the worker's
    // first beat, so the stop finds its signal handler in place.
    wait_for(30, "the worker's first beat", || {
        env.workers().len() > before
    });
    stop_worker(w);
}

fn status_of(env: &Env, email: &str) -> String {
    let mut conn = env.conn();
    let id = mailsplit::store::recipients::find_by_email(&mut conn, email)
        .unwrap()
        .unwrap();
    let r = mailsplit::store::recipients::load(&mut conn, &[id]).unwrap();
    r[0].status.as_str().to_string()
}

fn id_of(env: &Env, email: &str) -> i64 {
    mailsplit::store::recipients::find_by_email(&mut env.conn(), email)
        .unwrap()
        .unwrap()
}

/// `token` with its recipient id changed to `to` (MAC kept): a forgery.
fn retarget(token: &str, to: i64) -> String {
    use data_encoding::BASE64URL_NOPAD;
    let mut raw = BASE64URL_NOPAD.decode(token.as_bytes()).unwrap();
    assert!(raw[0] < 0x80 && raw[1] < 0x80 && to < 0x80, "one-byte ids");
    raw[1] = to as u8;
    BASE64URL_NOPAD.encode(&raw)
}

fn preference_centre(kind: Kind) {
    let env = world(kind);
    let (ann_mail, bob_mail) = sent_to_both(&env);
    let ann = link(&parts(&ann_mail).html, "p");
    let bob = link(&parts(&bob_mail).html, "p");
    let served = env.serve(None);
    let port = served.public;

    // GET shows the name and the public lists, ticked; never the private one.
    let (code, page) = get(port, &ann);
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("value=\"Ann\""), "{page}");
    assert!(page.contains("value=\"news\" checked"), "{page}");
    assert!(page.contains("value=\"offers\" checked"), "{page}");
    assert!(!page.contains("vip"), "{page}");
    assert!(page.contains("<label for=\"unsubscribe_all\">"), "{page}");
    assert!(
        !page.contains("<script") && !page.contains("style="),
        "{page}"
    );

    // Forged tokens: another recipient's id under Ann's MAC, another
    // purpose's token, garbage. The same 404, nobody's data.
    let ann_token = ann.trim_start_matches("/p/");
    let bob_id = id_of(&env, "bob@example.test");
    let campaign = env.status("first")["id"].as_i64();
    let signer = env.identity().signer;
    let mut forged = vec![
        format!("/p/{}", retarget(ann_token, bob_id)),
        format!("/p/{}x", ann_token),
        "/p/AAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_string(),
    ];
    if let Some(c) = campaign {
        forged.push(format!("/p/{}", signer.unsubscribe_token(c, bob_id)));
        forged.push(format!("/p/{}", signer.view_token(c, bob_id)));
    }
    for path in &forged {
        let (code, page) = get(port, path);
        assert_eq!(code, 404, "{path}: {page}");
        assert!(!page.contains("Bob") && !page.contains("Ann"), "{page}");
        let (code, _) = post(port, path, &[("name", "Mallory"), ("unsubscribe_all", "1")]);
        assert_eq!(code, 404, "{path}");
    }
    assert_eq!(status_of(&env, "bob@example.test"), "active");

    // Ann keeps offers only, renames herself, and tries to join the private
    // list by naming it: twice (idempotent).
    for _ in 0..2 {
        let (code, page) = post(
            port,
            &ann,
            &[("name", "Annie"), ("list", "offers"), ("list", "vip")],
        );
        assert_eq!(code, 200, "{page}");
        assert!(page.contains("value=\"news\">"), "{page}");
        assert!(page.contains("value=\"offers\" checked"), "{page}");
        assert!(!page.contains("vip"), "{page}");
    }
    assert_eq!(members(&env, "news"), "1");
    assert_eq!(members(&env, "offers"), "2");
    assert_eq!(members(&env, "vip"), "1");
    assert_eq!(status_of(&env, "ann@example.test"), "active");

    // Bob leaves everything; he stays on his lists but nothing reaches him.
    let (code, page) = post(
        port,
        &bob,
        &[("name", "Bob"), ("list", "news"), ("unsubscribe_all", "1")],
    );
    assert_eq!(code, 200, "{page}");
    assert_eq!(status_of(&env, "bob@example.test"), "unsubscribed");
    // A GET changes nothing.
    assert_eq!(get(port, &ann).0, 200);
    assert_eq!(members(&env, "news"), "1");
    drop(served);

    // The next campaigns: news reaches nobody (Ann left it, Bob left all);
    // offers reaches Ann under her new name.
    let html = env.dir.path().join("next.html");
    std::fs::write(&html, "<p>Hi {{ name }}</p>\n").unwrap();
    send(&env, "second", "news", &html);
    assert_eq!(env.status("second")["sent"], 0, "{}", env.status("second"));
    send(&env, "third", "offers", &html);
    assert_eq!(env.status("third")["sent"], 1, "{}", env.status("third"));
    let mail = wait_mail(&env, "ann@example.test", 2);
    assert!(parts(&mail).html.contains("Hi Annie"), "{mail}");
    assert_eq!(mails_to(&env, "bob@example.test").len(), 1);
}

fn view_in_browser(kind: Kind) {
    let env = world(kind);
    let (ann_mail, bob_mail) = sent_to_both(&env);
    let ann = link(&parts(&ann_mail).html, "v");
    let bob = link(&parts(&bob_mail).html, "v");
    let served = env.serve(None);
    let port = served.public;

    let r = ureq::get(&format!("http://127.0.0.1:{port}{ann}"))
        .call()
        .unwrap();
    let csp = r.header("content-security-policy").unwrap().to_string();
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script"),
        "{csp}"
    );
    let page = r.into_string().unwrap();
    assert!(page.contains("Hello Ann!"), "{page}");
    assert!(!page.contains("Bob"), "{page}");
    // Tracking links intact: the sale link goes through /c/, as in the mail.
    assert!(page.contains(&format!("{PUBLIC}/c/")), "{page}");
    assert!(!page.contains("https://shop.example.test/sale"), "{page}");
    let (code, page) = get(port, &bob);
    assert_eq!(code, 200);
    assert!(
        page.contains("Hello Bob!") && !page.contains("Ann"),
        "{page}"
    );

    // Ann's token edited to name Bob: refused, nothing of Bob's shown.
    let forged = format!(
        "/v/{}",
        retarget(
            ann.trim_start_matches("/v/"),
            id_of(&env, "bob@example.test")
        )
    );
    let (code, page) = get(port, &forged);
    assert_eq!(code, 404);
    assert!(!page.contains("Bob"), "{page}");
    // A preferences token is no view token.
    let p = link(&parts(&ann_mail).html, "p");
    assert_eq!(
        get(port, &format!("/v/{}", p.trim_start_matches("/p/"))).0,
        404
    );

    // A new content version after the send: the view still shows what
    // was sent.
    let mut conn = env.conn();
    let id = env.status("first")["id"].as_i64().unwrap_or(1);
    mailsplit::store::content::add(
        &mut conn,
        id,
        mailsplit::store::content::ContentKind::Html,
        "Changed",
        "<p>Version two for {{ name }}</p>",
        "Version two for {{ name }}",
        &mailsplit::store::content::VersionTracking {
            track: Default::default(),
            links: vec![],
        },
    )
    .unwrap();
    let (code, page) = get(port, &ann);
    assert_eq!(code, 200);
    assert!(
        page.contains("Hello Ann!") && !page.contains("Version two"),
        "{page}"
    );
}

both!(
    builtin_confirmation_mail,
    preference_centre,
    view_in_browser
);
