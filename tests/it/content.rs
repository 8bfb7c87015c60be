//! Campaign content written at run time: `campaign create`
//! with `--html [--text]`, `--markdown` or `--template`, Jinja templates
//! stored in the database and rendered by the worker (and `preview`, the
//! same path); bad templates refused with file and line; no template can
//! read a file. Against the real binary, beanstalkd, the scripted SMTP
//! peer, SQLite and PostgreSQL.

use crate::util::*;

/// Import `csv` into list `list`.
fn import(env: &Env, list: &str, csv: &str) {
    let path = env.dir.path().join(format!("{list}.csv"));
    std::fs::write(&path, csv).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", path.to_str().unwrap(), "--list", list]);
}

/// Write `text` to a file in the test's directory; returns its path.
pub(crate) fn file(env: &Env, name: &str, text: &str) -> String {
    let path = env.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn create(env: &Env, name: &str, content: &[&str], subject: &str) -> std::process::Output {
    let mut args = vec![
        "campaign",
        "create",
        name,
        "--list",
        "news",
        "--subject",
        subject,
        "--from",
        "Shop <news@example.test>",
    ];
    args.extend_from_slice(content);
    env.run(&args)
}

/// Send campaign `name` through a worker to `peer`; the parsed messages
/// by envelope recipient.
pub(crate) fn send_all(
    env: &Env,
    peer: &ScriptedSmtp,
    name: &str,
    n: i64,
) -> Vec<(String, String)> {
    env.ok(&["enqueue", name]);
    let w = env.worker(&[]);
    wait_for(60, "every message sent", || env.status(name)["sent"] == n);
    stop_worker(w);
    let mut got: Vec<(String, String)> = peer
        .messages
        .lock()
        .unwrap()
        .iter()
        .map(|(to, text)| (to.join(","), text.clone()))
        .collect();
    got.sort();
    got
}

const PAGE: &str = "<html><head><style>p.city { color: #c00 }</style></head><body>\n\
<p>Hello {{ name | default(\"friend\") }},</p>\n\
<p class=\"city\">News from {{ attributes.city }}{% if not attributes.city %}everywhere{% endif %}.</p>\n\
<p>Sent by {{ campaign.name }} to {{ email }}.<br>\n\
<a href=\"{{ unsubscribe_url }}\">Unsubscribe</a></p>\n\
</body></html>\n";

fn html_campaign_renders_attributes_escaping_html_only(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(
        &env,
        "news",
        "email,name,city\nbob@example.test,<b>Bob</b>,Lyon & Co\nann@example.test,,\n",
    );
    let page = file(&env, "page.html", PAGE);
    let out = create(
        &env,
        "weekly",
        &["--html", &page],
        "News for {{ name | default(\"friend\") }}",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // The preview is the message the worker sends.
    let preview = env.ok(&["preview", "weekly", "--recipient", "bob@example.test"]);
    let got = send_all(&env, &peer, "weekly", 2);
    assert_eq!(got.len(), 2, "{got:?}");
    let (ann, bob) = (parts(&got[0].1), parts(&got[1].1));
    assert!(got[1].0.contains("bob@"), "{got:?}");
    let previewed = parts(&preview);
    assert_eq!(previewed.html, bob.html);
    assert_eq!(previewed.text, bob.text);

    assert_eq!(bob.subject, "News for <b>Bob</b>");
    // HTML: the name as text, attributes escaped, CSS inlined.
    assert!(bob.html.contains("Hello &lt;b&gt;Bob&lt;"), "{}", bob.html);
    assert!(!bob.html.contains("<b>Bob"), "{}", bob.html);
    assert!(bob.html.contains("Lyon &amp; Co"), "{}", bob.html);
    assert!(bob.html.contains("style=\"color: #c00;\""), "{}", bob.html);
    assert!(!bob.html.contains("<style"), "{}", bob.html);
    assert!(
        bob.html.contains("Sent by weekly to bob@example.test"),
        "{}",
        bob.html
    );
    // Text, derived from the HTML: not escaped; the link as `text (url)`.
    assert!(bob.text.contains("Hello <b>Bob</b>,"), "{}", bob.text);
    assert!(bob.text.contains("News from Lyon & Co."), "{}", bob.text);
    assert!(bob.text.contains("Unsubscribe (mailto:"), "{}", bob.text);
    // No name, no city: the defaults.
    assert_eq!(ann.subject, "News for friend");
    assert!(ann.text.contains("Hello friend,"), "{}", ann.text);
    assert!(ann.text.contains("News from everywhere."), "{}", ann.text);
}

fn markdown_campaign_sends_both_parts(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(&env, "news", "email,name\nada@example.test,Ada\n");
    let md = file(
        &env,
        "news.md",
        "# Hi {{ name }}\n\nOur *spring* collection: [see it](https://shop.example.test/spring).\n\n\
         {% for n in range(3) %}- item {{ n }}\n{% endfor %}",
    );
    let out = create(&env, "md", &["--markdown", &md], "Spring, {{ name }}");
    assert!(out.status.success(), "{}", stderr(&out));
    let got = send_all(&env, &peer, "md", 1);
    let ada = parts(&got[0].1);
    assert_eq!(ada.subject, "Spring, Ada");
    assert!(ada.html.contains("<h1>Hi Ada</h1>"), "{}", ada.html);
    assert!(ada.html.contains("<em>spring</em>"), "{}", ada.html);
    assert!(
        ada.html
            .contains("<a href=\"https://shop.example.test/spring\">see it</a>"),
        "{}",
        ada.html
    );
    assert!(ada.html.contains("item 2"), "{}", ada.html);
    assert!(ada.text.contains("Hi Ada"), "{}", ada.text);
    assert!(
        ada.text
            .contains("see it (https://shop.example.test/spring)"),
        "{}",
        ada.text
    );
    assert!(!ada.text.contains("<h1>"), "{}", ada.text);
}

fn template_campaigns_are_unchanged(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(
        &env,
        "news",
        "email,name,city\nada@example.test,Ada,Paris\n",
    );
    let out = create(
        &env,
        "starter",
        &["--template", "newsletter"],
        "Spring news",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let got = send_all(&env, &peer, "starter", 1);
    let ada = parts(&got[0].1);
    assert_eq!(ada.subject, "Spring news");
    assert!(ada.text.starts_with("Hello Ada,"), "{}", ada.text);
    assert!(ada.text.contains("around Paris"), "{}", ada.text);
    assert!(ada.html.contains("<h1>Hello Ada,</h1>"), "{}", ada.html);
    assert!(
        ada.html.contains("<title>Spring news</title>"),
        "{}",
        ada.html
    );
}

both!(
    html_campaign_renders_attributes_escaping_html_only,
    markdown_campaign_sends_both_parts,
    template_campaigns_are_unchanged,
);

/// Exit 2, and stderr names `needle`s; nothing was created.
fn refused(env: &Env, out: &std::process::Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(!env.ok(&["campaign", "list"]).contains("bad"), "created");
}

#[test]
fn bad_templates_are_refused_with_file_and_line() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    import(&env, "news", "email\nada@example.test\n");
    let syntax = file(&env, "syntax.html", "<p>\nHello\n{{ name </p>\n");
    let out = create(&env, "bad1", &["--html", &syntax], "Hi");
    refused(&env, &out, &[&format!("{syntax}:3:"), "syntax error"]);
    let unknown = file(&env, "unknown.md", "Hello\n\n{{ nmae }}\n");
    let out = create(&env, "bad2", &["--markdown", &unknown], "Hi");
    refused(
        &env,
        &out,
        &[&format!("{unknown}:3:"), "unknown variable `nmae`"],
    );
    let page = file(&env, "ok.html", "<p>Hi</p>");
    let text = file(&env, "bad.txt", "Hi\n{% if name %}\n");
    let out = create(&env, "bad3", &["--html", &page, "--text", &text], "Hi");
    refused(&env, &out, &[&text, "unexpected end of input"]);
    let out = create(&env, "bad4", &["--html", &page], "Hi {{ name");
    refused(&env, &out, &["--subject:1:"]);
    // Exactly one content option.
    let out = create(
        &env,
        "bad5",
        &["--html", &page, "--template", "newsletter"],
        "Hi",
    );
    refused(&env, &out, &["cannot be used with"]);
    let out = create(&env, "bad6", &[], "Hi");
    refused(&env, &out, &["--html"]);
    let out = create(&env, "bad7", &["--html", "/nonexistent/x.html"], "Hi");
    refused(&env, &out, &["/nonexistent/x.html"]);
}

#[test]
fn a_template_reads_no_file() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    import(&env, "news", "email\nada@example.test\n");
    for (i, attempt) in [
        "{% include \"/etc/passwd\" %}",
        "{% import \"/etc/passwd\" as p %}",
        "{% extends \"/etc/passwd\" %}",
        "{{ self._TemplateReference__context }}",
        "{{ range.__globals__ }}",
    ]
    .iter()
    .enumerate()
    {
        let page = file(&env, &format!("evil{i}.html"), &format!("<p>{attempt}</p>"));
        let out = create(&env, &format!("evil{i}"), &["--html", &page], "Hi");
        if out.status.success() {
            // Accepted only if it renders nothing of the file.
            let m = env.ok(&["preview", &format!("evil{i}")]);
            assert!(!m.contains("root:"), "{attempt}: {m}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{attempt}: {}", stderr(&out));
            assert!(!stderr(&out).contains("root:"), "{}", stderr(&out));
        }
    }
    // The include itself is refused, naming the file and line.
    let out = create(
        &env,
        "inc",
        &[
            "--html",
            &file(&env, "inc.html", "<p>\n{% include \"/etc/passwd\" %}</p>"),
        ],
        "Hi",
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("inc.html:2:"), "{}", stderr(&out));
}

/// `templates show` prints a starter that, copied into files, makes the
/// same message as the built-in template.
#[test]
fn a_shown_starter_copied_into_files_sends_the_same_message() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    import(
        &env,
        "news",
        "email,name,city\nada@example.test,Ada,Lyon & Co\n",
    );
    let both = env.ok(&["templates", "show", "announcement"]);
    assert!(both.starts_with("==> announcement.html <=="), "{both}");
    assert!(both.contains("==> announcement.txt <=="), "{both}");
    let html = file(
        &env,
        "a.html",
        &env.ok(&["templates", "show", "announcement", "--html"]),
    );
    let text = file(
        &env,
        "a.txt",
        &env.ok(&["templates", "show", "announcement", "--text"]),
    );
    let out = create(
        &env,
        "own",
        &["--html", &html, "--text", &text],
        "Plan change",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = create(
        &env,
        "builtin",
        &["--template", "announcement"],
        "Plan change",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let own = parts(&env.ok(&["preview", "own"]));
    let builtin = parts(&env.ok(&["preview", "builtin"]));
    assert_eq!(own.text.trim_end(), builtin.text.trim_end());
    assert!(own.html.contains("Dear Ada,"), "{}", own.html);
    assert!(
        own.html.contains("<strong>Plan change</strong>"),
        "{}",
        own.html
    );
    let out = env.run(&["templates", "show", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("newsletter, announcement"),
        "{}",
        stderr(&out)
    );
}

fn delete_takes_a_draft_only(kind: Kind) {
    let env = World::new(kind);
    import(&env, "news", "email\nada@example.test\nbob@example.test\n");
    let page = file(&env, "p.html", "<p>Hi {{ name }}</p>");
    let out = create(&env, "oops", &["--html", &page], "Hi");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(env
        .ok(&["campaign", "delete", "oops"])
        .contains("deleted campaign \"oops\""));
    let out = env.run(&["status", "oops"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // Nothing of it is left: the name is free again, its content too.
    let out = create(&env, "oops", &["--template", "newsletter"], "Again");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(env.ok(&["preview", "oops"]).contains("Subject: Again"));

    env.ok(&["enqueue", "oops"]);
    let out = env.run(&["campaign", "delete", "oops"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"oops\" is sending"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("`mailsplit cancel oops` stops it"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.status("oops")["recipients"], 2);
    // Once it has ended, nothing is left to stop: the advice is not
    // `cancel` (which would refuse), but where its history is.
    env.ok(&["cancel", "oops"]);
    let out = env.run(&["campaign", "delete", "oops"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("mailsplit cancel"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("has ended"), "{}", stderr(&out));
    assert_eq!(env.run(&["cancel", "oops"]).status.code(), Some(2));
    let out = env.run(&["campaign", "delete", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

mod delete {
    use super::*;
    both!(delete_takes_a_draft_only);
}

fn test_send_reaches_the_relay_and_leaves_the_ledger(kind: Kind) {
    let (_tmp, _bs, peer, mut env) = setup(
        kind,
        Script {
            keep_data: true,
            reject: Some("@refused.test".into()),
            ..Script::default()
        },
    );
    env.smtp = peer.url();
    import(
        &env,
        "news",
        "email,name,status\nzed@example.test,Zed,unsubscribed\nada@example.test,Ada,active\n",
    );
    let page = file(&env, "p.html", "<p>Hi {{ name }} &lt;{{ email }}&gt;</p>");
    let out = create(&env, "t", &["--html", &page], "News for {{ name }}");
    assert!(out.status.success(), "{}", stderr(&out));
    let before = env.status("t");
    let out = env.ok(&[
        "campaign",
        "test",
        "t",
        "--to",
        "qa@test.example,boss@test.example",
    ]);
    assert!(
        out.contains("sent a test message to boss@test.example"),
        "{out}"
    );
    let got = peer.messages.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    for (to, message) in &got {
        assert!(to[0].ends_with("@test.example"), "{to:?}");
        let m = parts(message);
        // Rendered for the first active member, subject marked.
        assert_eq!(m.subject, "[TEST] News for Ada");
        assert!(m.text.contains("Hi Ada <ada@example.test>"), "{}", m.text);
    }
    assert!(!got
        .iter()
        .any(|(to, _)| to.iter().any(|a| a.contains("example.test"))));
    // For another member, and a refusal is exit 1 naming the address.
    let out = env.run(&[
        "campaign",
        "test",
        "t",
        "--to",
        "x@refused.test",
        "--recipient",
        "zed@example.test",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("x@refused.test"), "{}", stderr(&out));
    // Nothing in the ledger or the counters.
    assert_eq!(env.status("t"), before);
    assert_eq!(env.status("t")["sent"], 0);
    let out = env.run(&["campaign", "test", "nope", "--to", "a@b.test"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

mod test_send {
    use super::*;
    both!(test_send_reaches_the_relay_and_leaves_the_ledger);
}

/// The parts' transfer encoding (`src/compose/transfer.rs`): inlined CSS
/// makes lines longer than 76 octets and css-inline writes `&euro;` back
/// as `€`, so lettre would quoted-print every HTML part. The HTML part goes
/// out `7bit`, its non-ASCII as character references, its lines within
/// 998 octets; the non-ASCII text part stays quoted-printable; a reader
/// sees the same characters in both.
#[test]
fn html_parts_go_out_7bit_with_the_same_characters() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    import(&env, "news", "email,name\nzoe@example.test,Zoë\n");
    let long = "x".repeat(300);
    let page = file(
        &env,
        "page.html",
        &format!(
            "<html><head><style>p {{ color: #333; font-family: Georgia, serif }}</style></head>\
             <body><p title=\"Grüße\">Hello {{{{ name }}}}, &euro; 49 — {long}</p></body></html>\n"
        ),
    );
    let text = file(&env, "page.txt", "Hello {{ name }}, € 49\n");
    let out = create(&env, "euro", &["--html", &page, "--text", &text], "Prices");
    assert!(out.status.success(), "{}", stderr(&out));
    let raw = env.ok(&["preview", "euro"]);
    let html_part = raw
        .split("Content-Type: text/html")
        .nth(1)
        .expect("an HTML part");
    assert!(
        html_part.contains("Content-Transfer-Encoding: 7bit"),
        "{html_part}"
    );
    assert!(
        html_part.contains("Zo&#235;") && html_part.contains("&#8364; 49 &#8212;"),
        "{html_part}"
    );
    assert!(raw.is_ascii());
    assert!(raw.lines().all(|l| l.len() <= 998));
    let text_part = raw.split("Content-Type: text/plain").nth(1).unwrap();
    assert!(
        text_part.contains("Content-Transfer-Encoding: quoted-printable"),
        "{text_part}"
    );
    let p = parts(&raw);
    assert!(p.text.contains("Hello Zoë, € 49"), "{}", p.text);
    assert!(
        p.html.contains(&long) && p.html.contains("Gr&#252;&#223;e"),
        "{}",
        p.html
    );
}
