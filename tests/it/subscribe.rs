//! The subscribers' side (issue 38): lists with a face (`list create`,
//! `list set`, `list ls`), `/subscribe` with double opt-in and
//! `/confirm/TOKEN`, against the real binary, beanstalkd, SQLite and
//! PostgreSQL.

use std::time::Duration;

use crate::util::*;

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

/// The confirmation mails queued so far (the messages ledger), as
/// (to, confirm_url).
fn confirmations(env: &Env) -> Vec<(String, String)> {
    let mut conn = env.conn();
    let mut out = Vec::new();
    for id in 1..100 {
        let Some(m) = mailsplit::store::messages::find(&mut conn, id).unwrap() else {
            continue;
        };
        assert_eq!(m.template_name, "confirm");
        let data: serde_json::Value = serde_json::from_str(&m.data).unwrap();
        out.push((m.to_addr, data["confirm_url"].as_str().unwrap().to_string()));
    }
    out
}

fn members(env: &Env, list: &str) -> String {
    ls_line(env, list)[1].clone()
}

fn double_opt_in(kind: Kind) {
    let env =
        World::with_peer(kind, Script::default()).var("MAILSPLIT_PUBLIC_URL", "http://127.0.0.1:9");
    env.ok(&["migrate"]);
    let html = env.dir.path().join("confirm.html");
    std::fs::write(
        &html,
        "<p>Confirm: <a href=\"{{ data.confirm_url }}\">yes</a></p>\n",
    )
    .unwrap();
    env.ok(&[
        "template",
        "create",
        "confirm",
        "--subject",
        "Please confirm",
        "--from",
        "shop@example.test",
        "--html",
        html.to_str().unwrap(),
    ]);
    env.ok(&[
        "list",
        "create",
        "weekly",
        "--title",
        "The <weekly>",
        "--public",
        "--double-opt-in",
    ]);
    env.ok(&["list", "create", "hidden"]);
    env.import_n("known", 1);
    let known = env.ok(&["list", "ls"]);
    assert!(known.contains("known"), "{known}");
    let served = env.serve(None);
    let port = served.public;

    // The form: public lists only, titles escaped, labels, a honeypot.
    let (code, page) = get(port, "/subscribe");
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("The &lt;weekly&gt;"), "{page}");
    assert!(!page.contains("hidden\""), "{page}");
    assert!(page.contains("<label for=\"email\">"), "{page}");
    assert!(page.contains("name=\"website\""), "{page}");
    assert!(!page.contains("<script") && !page.contains("<style") && !page.contains("style="));

    // A mistake is shown next to its field, nothing stored.
    let (code, page) = post(
        port,
        "/subscribe",
        &[("email", "not an address"), ("list", "weekly")],
    );
    assert_eq!(code, 422);
    assert!(page.contains("id=\"email-error\""), "{page}");
    assert!(confirmations(&env).is_empty());

    // Known and unknown addresses get the same page and status.
    let a = post(
        port,
        "/subscribe",
        &[("email", "user1@example.test"), ("list", "weekly")],
    );
    let b = post(
        port,
        "/subscribe",
        &[
            ("email", "new@example.test"),
            ("name", "New"),
            ("list", "weekly"),
        ],
    );
    assert_eq!(a, b);
    assert_eq!(a.0, 200);
    assert!(a.1.contains("Check your inbox"));

    // The honeypot: same page, nothing stored, no mail.
    let c = post(
        port,
        "/subscribe",
        &[
            ("email", "bot@example.test"),
            ("list", "weekly"),
            ("website", "http://spam"),
        ],
    );
    assert_eq!(c, b);
    assert_eq!(confirmations(&env).len(), 2);

    // Subscription bombing: 7 sign-ups of one address, at most 3 mails, the
    // same answer every time.
    for _ in 0..7 {
        assert_eq!(
            post(
                port,
                "/subscribe",
                &[("email", "victim@example.test"), ("list", "weekly")]
            ),
            b
        );
    }
    let sent = confirmations(&env);
    assert_eq!(
        sent.iter().filter(|(to, _)| to.contains("victim@")).count(),
        3,
        "{sent:?}"
    );
    assert!(!sent.iter().any(|(to, _)| to.contains("bot@")));

    // Unconfirmed: not a member, so no campaign reaches them.
    assert_eq!(members(&env, "weekly"), "0");
    let (_, url) = sent
        .iter()
        .find(|(to, _)| to.contains("new@"))
        .unwrap()
        .clone();
    let path = url.strip_prefix("http://127.0.0.1:9").unwrap().to_string();
    // A scanner's GETs (several) never confirm.
    for _ in 0..3 {
        let (code, page) = get(port, &path);
        assert_eq!(code, 200);
        assert!(
            page.contains("<button type=\"submit\">Confirm</button>"),
            "{page}"
        );
    }
    assert_eq!(members(&env, "weekly"), "0");
    // A tampered token is not a link of ours.
    let mut bad = path.clone();
    let last = bad.pop().unwrap();
    bad.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(post(port, &bad, &[]).0, 404);
    assert_eq!(members(&env, "weekly"), "0");
    // The POST confirms, once.
    let (code, page) = post(port, &path, &[]);
    assert_eq!(code, 200, "{page}");
    assert_eq!(members(&env, "weekly"), "1");
    assert_eq!(post(port, &path, &[]).0, 200);
    assert_eq!(members(&env, "weekly"), "1");
    drop(served);

    // A campaign of the list reaches the confirmed member only: the
    // unconfirmed victim and user1 get nothing.
    env.create_campaign("letter", "weekly", &[]);
    env.ok(&["enqueue", "letter"]);
    let w = env.worker(&[]);
    wait_done(&env, "letter", 60);
    stop_worker(w);
    let status = env.status("letter");
    assert_eq!(status["recipients"], 1, "{status}");
    assert_eq!(status["sent"], 1, "{status}");
}

/// The `list ls` line of `list`, split on blanks.
fn ls_line(env: &Env, list: &str) -> Vec<String> {
    let out = env.ok(&["list", "ls"]);
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(list))
        .unwrap_or_else(|| panic!("no line for {list}:\n{out}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn lists_with_a_face(kind: Kind) {
    let env = World::new(kind);
    env.ok(&["migrate"]);
    env.ok(&[
        "list",
        "create",
        "weekly",
        "--title",
        "The weekly letter",
        "--public",
        "--double-opt-in",
    ]);
    env.ok(&["list", "create", "quiet"]);
    // An imported list keeps the defaults: private, single opt-in.
    env.import_n("imported", 3);

    assert_eq!(
        ls_line(&env, "weekly"),
        ["weekly", "0", "0", "public", "double", "The", "weekly", "letter"]
    );
    assert_eq!(
        ls_line(&env, "quiet"),
        ["quiet", "0", "0", "private", "single", "-"]
    );
    assert_eq!(
        ls_line(&env, "imported"),
        ["imported", "3", "3", "private", "single", "-"]
    );

    // A second create is refused, naming the fix; nothing changes.
    let out = env.run(&["list", "create", "weekly", "--private"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("list set"), "{}", stderr(&out));
    assert_eq!(ls_line(&env, "weekly")[3], "public");

    // `list set` changes only what it names.
    env.ok(&[
        "list",
        "set",
        "imported",
        "--public",
        "--title",
        "Shop news",
    ]);
    assert_eq!(
        ls_line(&env, "imported"),
        ["imported", "3", "3", "public", "single", "Shop", "news"]
    );
    env.ok(&["list", "set", "weekly", "--private", "--single-opt-in"]);
    assert_eq!(
        ls_line(&env, "weekly"),
        ["weekly", "0", "0", "private", "single", "The", "weekly", "letter"]
    );

    // Mistakes are usage errors that say what to do.
    let out = env.run(&["list", "set", "weekly"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--title"), "{}", stderr(&out));
    let out = env.run(&["list", "set", "nosuch", "--public"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = env.run(&["list", "create", "x", "--public", "--private"]);
    assert_eq!(out.status.code(), Some(2));
}

both!(lists_with_a_face, double_opt_in);

#[test]
fn list_form_prints_an_embeddable_form() {
    let env = World::new(Kind::Sqlite);
    env.ok(&["migrate"]);
    env.ok(&["list", "create", "weekly", "--public", "--title", "Weekly"]);
    env.ok(&["list", "create", "private"]);
    let out = env
        .cmd(&["list", "form", "weekly"])
        .env("MAILSPLIT_PUBLIC_URL", "https://news.example.test/")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let form = stdout(&out);
    assert!(
        form.contains("action=\"https://news.example.test/subscribe\""),
        "{form}"
    );
    assert!(form.contains("name=\"list\"") && form.contains("value=\"weekly\""));
    assert!(form.contains("name=\"website\""), "{form}");
    // A private list, or no public URL: refused, naming the fix.
    let out = env
        .cmd(&["list", "form", "private"])
        .env("MAILSPLIT_PUBLIC_URL", "https://news.example.test")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--public"), "{}", stderr(&out));
    let out = env.run(&["list", "form", "weekly"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("MAILSPLIT_PUBLIC_URL"),
        "{}",
        stderr(&out)
    );
}
