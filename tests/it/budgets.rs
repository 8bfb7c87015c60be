//! Templates under a budget: a template that is fast
//! for the sample recipient and loops without end, or grows a huge
//! message, for another's data fails that recipient with the reason; the
//! worker sends the others, stops on SIGTERM within its grace and holds
//! no such message in memory; `preview` ends with the reason; the admin
//! listener answers while a campaign page renders one. Links mail clients
//! must not follow (item 9) are refused at create and edit, scripts
//! warned about, and no stored link answers a 302 without Location.
//! Against the real binary, beanstalkd, the scripted SMTP peer, SQLite
//! and PostgreSQL.

use crate::util::*;

/// Loops 10^10 times for a recipient whose `spin` attribute is set.
const SPIN: &str = "<p>Hello {{ name }}</p>{% if attributes.spin %}{% for i in range(100000) %}\
    {% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}\n";

/// Writes 100 MB for a recipient whose `big` attribute is set.
const BIG: &str = "<p>Hello {{ name }}</p>{% if attributes.big %}{% for i in range(100) %}\
    {{ \"x\" * 1000000 }}{% endfor %}{% endif %}\n";

fn file(env: &Env, name: &str, text: &str) -> String {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// List `news`: `n` recipients, those at `flagged` with attribute `flag`.
fn import(env: &Env, n: usize, flag: &str, flagged: &[usize]) {
    let mut csv = format!("email,name,{flag}\n");
    for i in 0..n {
        let set = if flagged.contains(&i) { "1" } else { "" };
        csv.push_str(&format!("r{i:03}@example.test,R{i},{set}\n"));
    }
    let path = file(env, "news.csv", &csv);
    env.ok(&["migrate"]);
    env.ok(&["import", &path, "--list", "news"]);
}

fn create(env: &Env, name: &str, html: &str, extra: &[&str]) -> std::process::Output {
    let html = file(env, &format!("{name}.html"), html);
    let mut args = vec![
        "campaign",
        "create",
        name,
        "--list",
        "news",
        "--html",
        &html,
        "--subject",
        "News for {{ name }}",
        "--from",
        "news@example.test",
    ];
    args.extend_from_slice(extra);
    env.run(&args)
}

/// The failed recipients' reasons, from the ledger.
fn failures(env: &Env, name: &str) -> Vec<String> {
    let id = env.status(name)["id"].as_i64().unwrap();
    mailsplit::store::deliveries::failures(&mut env.conn(), id, 1_000)
        .unwrap()
        .into_iter()
        .map(|(_, why)| why)
        .collect()
}

/// The peak resident memory of a running process, in kB.
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn spinning_recipients_fail_and_the_rest_are_sent(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(kind, Script::default());
    env.smtp = peer.url();
    let spinners = [3, 7, 11, 15, 19, 23, 27, 31, 35, 39];
    import(&env, 60, "spin", &spinners);
    let out = create(&env, "spin", SPIN, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    env.ok(&["enqueue", "spin"]);
    let w = env.worker(&["--concurrency", "10", "--grace", "5"]);
    wait_for(120, "every recipient to have an outcome", || {
        let s = env.status("spin");
        s["sent"].as_i64().unwrap_or(0) + s["failed"].as_i64().unwrap_or(0) == 60
    });
    stop_worker(w);
    let s = env.status("spin");
    assert_eq!(
        (s["sent"].as_i64(), s["failed"].as_i64()),
        (Some(50), Some(10)),
        "{s}"
    );
    assert_eq!(peer.total(), 50);
    let why = failures(&env, "spin");
    assert_eq!(why.len(), 10);
    assert!(why.iter().all(|w| w.contains("render budget")), "{why:?}");
}

/// A worker whose every job is rendering a spinning template stops on
/// SIGTERM within its grace, exit 0.
fn a_worker_rendering_a_spinning_template_stops_within_its_grace(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(kind, Script::default());
    env.smtp = peer.url();
    let all: Vec<usize> = (0..40).collect();
    import(&env, 40, "spin", &all);
    let out = create(&env, "spin", SPIN, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    env.ok(&["enqueue", "spin"]);
    let mut w = env.worker(&["--concurrency", "10", "--grace", "2"]);
    wait_for(60, "the first spinning recipient to fail", || {
        env.status("spin")["failed"].as_i64().unwrap_or(0) >= 1
    });
    signal(&w.0, "TERM");
    // Within the grace and the one render then running, which its fuel
    // ends (before, it never did: a render cannot be interrupted).
    let status = wait_exit(&mut w.0, 2 + 5);
    assert!(status.success(), "{status:?}");
    assert_eq!(peer.total(), 0);
}

fn a_huge_message_fails_at_the_size_cap_with_memory_bounded(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(kind, Script::default());
    env.smtp = peer.url();
    import(&env, 20, "big", &[1, 5, 9, 13, 17]);
    let out = create(&env, "big", BIG, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    env.ok(&["enqueue", "big"]);
    let w = env.worker(&["--concurrency", "10"]);
    wait_for(120, "every recipient to have an outcome", || {
        let s = env.status("big");
        s["sent"].as_i64().unwrap_or(0) + s["failed"].as_i64().unwrap_or(0) == 20
    });
    let peak = peak_rss_kb(w.0.id());
    stop_worker(w);
    eprintln!("worker peak RSS: {peak} kB");
    let s = env.status("big");
    assert_eq!(
        (s["sent"].as_i64(), s["failed"].as_i64()),
        (Some(15), Some(5)),
        "{s}"
    );
    let why = failures(&env, "big");
    assert!(
        why.iter()
            .all(|w| w.contains("size cap of 10485760 bytes") && w.contains("--max-message-size")),
        "{why:?}"
    );
    // Five 100 MB messages were never held: the render stopped at 10 MB.
    assert!(peak < 200_000, "worker peak RSS {peak} kB");
}

/// `--max-message-size` sets the cap; a message under the default but
/// over it fails, naming it.
fn the_size_cap_is_the_workers_flag(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(kind, Script::default());
    env.smtp = peer.url();
    import(&env, 3, "big", &[]);
    let html = "<p>{{ name }}</p>{% if name == 'R1' %}{{ 'y' * 50000 }}{% endif %}\n";
    let out = create(&env, "cap", html, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    env.ok(&["enqueue", "cap"]);
    let w = env.worker(&["--max-message-size", "20000"]);
    wait_for(60, "every recipient to have an outcome", || {
        let s = env.status("cap");
        s["sent"].as_i64().unwrap_or(0) + s["failed"].as_i64().unwrap_or(0) == 3
    });
    stop_worker(w);
    let why = failures(&env, "cap");
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].contains("size cap of 20000 bytes"), "{why:?}");
    assert_eq!(peer.total(), 2);
    let out = env.run(&["worker", "--max-message-size", "10"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--max-message-size"),
        "{}",
        stderr(&out)
    );
}

/// `preview` of a recipient the template spins for ends with the reason.
fn preview_of_a_spinning_template_ends_with_the_reason(kind: Kind) {
    let env = World::new(kind);
    import(&env, 3, "spin", &[1]);
    let out = create(&env, "spin", SPIN, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output_within(
        &mut env.cmd(&["preview", "spin", "--recipient", "r001@example.test"]),
        60,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("render budget"), "{}", stderr(&out));
    let fine = env.ok(&["preview", "spin", "--recipient", "r000@example.test"]);
    assert!(fine.contains("Hello R0"), "{fine}");
}

/// A template that spins for the sample recipient itself is refused at
/// create, with the file.
fn a_template_spinning_for_the_sample_is_refused_at_create(kind: Kind) {
    let env = World::new(kind);
    import(&env, 1, "spin", &[]);
    let out = create(
        &env,
        "always",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("always.html"), "{}", stderr(&out));
    assert!(stderr(&out).contains("render budget"), "{}", stderr(&out));
}

/// The campaign page of a campaign whose sample recipient the template
/// spins for answers with the reason; the dashboard and /metrics answer
/// while it renders.
fn admin_pages_answer_while_a_campaign_page_renders_a_spinning_template(kind: Kind) {
    let env = World::new(kind);
    import(&env, 3, "spin", &[0]);
    let out = create(&env, "spin", SPIN, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = env.status("spin")["id"].as_i64().unwrap();
    let served = env.serve(None);
    let admin = served.admin;
    let page =
        std::thread::spawn(move || http("GET", admin, &format!("/campaigns/{id}"), &[], None));
    for path in ["/", "/metrics", "/"] {
        let r = http("GET", admin, path, &[], None);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    let page = page.join().unwrap();
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("render budget"), "{}", page.body);
}

fn links_that_run_code_are_refused_and_scripts_warned_about(kind: Kind) {
    let env = World::new(kind);
    import(&env, 1, "x", &[]);
    for (href, shown) in [
        ("javascript:alert(1)", "javascript:alert(1)"),
        ("JaVa&#x09;ScRiPt:alert(1)", "JaVa\\tScRiPt:alert(1)"),
        ("vbscript:msgbox", "vbscript:msgbox"),
        ("data:text/html,hi", "data:text/html,hi"),
        ("https://shop.example/&#10;x", "https://shop.example/\\nx"),
    ] {
        let html = format!(
            "<p>Hi</p>\n<p><a href=\"https://ok.example\">ok</a>\n<a href=\"{href}\">x</a></p>\n"
        );
        let out = create(&env, "bad", &html, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{href}: {err}");
        assert!(err.contains("bad.html:3"), "{href}: {err}");
        assert!(err.contains(shown), "{href}: {err}");
    }
    assert!(env.ok(&["campaign", "list"]).contains("no campaigns"));

    let md = file(&env, "bad.md", "# Hi\n\n[x](javascript:alert(1))\n");
    let out = env.run(&[
        "campaign",
        "create",
        "md",
        "--list",
        "news",
        "--markdown",
        &md,
        "--subject",
        "S",
        "--from",
        "news@example.test",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("javascript:alert(1)"),
        "{}",
        stderr(&out)
    );

    let html = "<p onclick=\"go()\">Hi</p>\n<script>alert(1)</script>\n<a href=\"mailto:a@example.test\">m</a>\n";
    let out = create(&env, "scripted", html, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("scripted.html:1: onclick"), "{err}");
    assert!(err.contains("scripted.html:2: <script>"), "{err}");
    assert!(err.contains("mail clients strip"), "{err}");

    // `campaign edit` checks the same way.
    let bad = file(&env, "edit.html", "<a href=\"javascript:x()\">x</a>\n");
    let out = env.run(&["campaign", "edit", "scripted", "--html", &bad]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("edit.html:1"), "{}", stderr(&out));
    let with_handler = file(&env, "edit2.html", "<img src=\"x\" onerror=\"y()\">\n");
    let out = env.run(&["campaign", "edit", "scripted", "--html", &with_handler]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("onerror"), "{}", stderr(&out));
}

/// A stored link that is no valid Location (as one stored before the
/// check could be) answers 404, not a 302 without Location.
fn a_stored_link_with_a_control_character_is_not_found(kind: Kind) {
    let env = World::new(kind);
    import(&env, 1, "x", &[]);
    let served = env.serve(None);
    let base = format!("http://127.0.0.1:{}", served.public);
    let html = "<p><a href=\"https://shop.example/a\">a</a> <a href=\"https://shop.example/b\">b</a></p>\n";
    let out = create(
        &env,
        "t",
        html,
        &["--public-url", &base, "--track", "clicks"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = env.status("t")["id"].as_i64().unwrap();
    let preview = env.ok(&["preview", "t"]);
    let html = parts(&preview).html.replace("&#x2f;", "/");
    let links: Vec<&str> = html
        .split("href=\"")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect();
    assert_eq!(links.len(), 2, "{html}");
    // As a link stored before `campaign create` refused them would be.
    env.sql(&format!(
        "UPDATE campaign_links SET url = 'https://shop.example/a\r\nSet-Cookie: x=1' \
         WHERE campaign_id = {id} AND url = 'https://shop.example/a'"
    ));
    let path = |url: &str| {
        url.strip_prefix(&base)
            .unwrap_or_else(|| panic!("{url} not under {base}: {html}"))
            .to_string()
    };
    let broken = http("GET", served.public, &path(links[0]), &[], None);
    assert_eq!(broken.status, 404, "{broken:?}");
    assert_eq!(broken.header("Location"), None);
    let fine = http("GET", served.public, &path(links[1]), &[], None);
    assert_eq!(fine.status, 302, "{fine:?}");
    assert_eq!(fine.header("Location"), Some("https://shop.example/b"));
}

both!(
    spinning_recipients_fail_and_the_rest_are_sent,
    a_worker_rendering_a_spinning_template_stops_within_its_grace,
    a_huge_message_fails_at_the_size_cap_with_memory_bounded,
    the_size_cap_is_the_workers_flag,
    preview_of_a_spinning_template_ends_with_the_reason,
    a_template_spinning_for_the_sample_is_refused_at_create,
    admin_pages_answer_while_a_campaign_page_renders_a_spinning_template,
    links_that_run_code_are_refused_and_scripts_warned_about,
    a_stored_link_with_a_control_character_is_not_found,
);
