//! The headers large mailbox providers require (Message-ID on the From
//! domain in A-labels, Date, List-Id, Feedback-ID, List-Unsubscribe and
//! List-Unsubscribe-Post), `campaign create --public-url` and its warnings,
//! and links that can only ever be http(s) or mailto — read from the
//! message `preview` composes, which is the message a worker sends.

use crate::util::{header, stderr, stdout, Env, Kind};

fn import(env: &Env, list: &str, csv: &str) -> std::process::Output {
    let path = env.dir.path().join(format!("{list}.csv"));
    std::fs::write(&path, csv).unwrap();
    env.ok(&["migrate"]);
    env.run(&["import", path.to_str().unwrap(), "--list", list])
}

#[test]
fn required_headers_on_the_from_domain_in_a_labels() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    import(&env, "news", "email,name\nada@example.test,Ada\n");
    let out = env.try_create_campaign_from(
        "spring sale",
        "news",
        "Shop <news@Exämple.TEST>",
        &["--public-url", "https://mail.exämple.test/"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let m = env.ok(&["preview", "spring sale"]);
    let database = env.identity().database_id;
    let mid = header(&m, "Message-ID");
    assert_eq!(mid.len(), 1);
    assert!(
        mid[0].starts_with('<') && mid[0].ends_with("@xn--exmple-cua.test>"),
        "{m}"
    );
    assert!(mid[0].contains(&database), "{m}");
    assert_eq!(header(&m, "Date").len(), 1, "{m}");
    assert_eq!(header(&m, "MIME-Version"), ["1.0"]);
    assert_eq!(
        header(&m, "List-Id"),
        ["\"news\" <news.xn--exmple-cua.test>"]
    );
    assert_eq!(
        header(&m, "Feedback-ID"),
        [format!("spring-sale:news:newsletter:{database}").as_str()]
    );
    let link = header(&m, "List-Unsubscribe");
    assert_eq!(link.len(), 1);
    assert!(
        link[0].starts_with("<https://mail.xn--exmple-cua.test/u/"),
        "{m}"
    );
    assert_eq!(
        header(&m, "List-Unsubscribe-Post"),
        ["List-Unsubscribe=One-Click"]
    );
    // The templates' link is that same one-click link.
    let url = link[0].trim_matches(['<', '>']);
    assert!(m.contains(&format!("Unsubscribe: {url}")), "{m}");
    // Every header but From (whose display form is the sender's) is ASCII:
    // never an encoded word or raw UTF-8 in an id.
    for name in ["Message-ID", "List-Id", "Feedback-ID", "List-Unsubscribe"] {
        assert!(header(&m, name)[0].is_ascii(), "{name}");
        assert!(!header(&m, name)[0].contains("=?"), "{name}");
    }
    // Each message has its own id; a retry of one keeps it.
    assert_eq!(
        header(&env.ok(&["preview", "spring sale"]), "Message-ID"),
        mid
    );
}

#[test]
fn public_url_is_checked_and_its_absence_warned_about() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    import(&env, "news", "email,name\nada@example.test,Ada\n");
    for (bad, why) in [
        ("http://mail.example.test", "loopback"),
        ("javascript:alert(1)", "https"),
        ("mail.example.test", "URL"),
        ("https://mail.example.test/?x=1", "query"),
        ("https://user:s3cr3t@mail.example.test", "password"),
    ] {
        let out =
            env.try_create_campaign_from("c", "news", "news@example.test", &["--public-url", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{bad}: {}", stderr(&out));
        assert!(!stderr(&out).contains("s3cr3t"), "{}", stderr(&out));
    }
    assert!(env.ok(&["campaign", "list"]).contains("no campaigns"));

    // No public URL: warned, and the message has no one-click header.
    let out = env.try_create_campaign_from("plain", "news", "news@example.test", &[]);
    assert!(out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no --public-url") && err.contains("one-click"),
        "{err}"
    );
    assert!(err.contains("example.test has no DKIM key"), "{err}");
    assert!(err.contains("mailsplit dkim keygen example.test"), "{err}");
    let m = env.ok(&["preview", "plain"]);
    assert!(header(&m, "List-Unsubscribe-Post").is_empty(), "{m}");
    assert_eq!(
        header(&m, "List-Unsubscribe"),
        ["<mailto:news@example.test?subject=unsubscribe>"]
    );

    // MAILSPLIT_PUBLIC_URL is the default; http is fine on loopback; with
    // a DKIM key neither warning shows.
    env.ok(&["dkim", "keygen", "example.test", "--algorithm", "ed25519"]);
    let out = env
        .cmd(&[
            "campaign",
            "create",
            "env",
            "--list",
            "news",
            "--template",
            "newsletter",
            "--subject",
            "Hi",
            "--from",
            "news@example.test",
        ])
        .env("MAILSPLIT_PUBLIC_URL", "http://127.0.0.1:8080")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    assert!(stdout(&out).contains("http://127.0.0.1:8080/u/TOKEN"));
    let m = env.ok(&["preview", "env"]);
    assert!(header(&m, "List-Unsubscribe")[0].starts_with("<http://127.0.0.1:8080/u/"));
}

#[test]
fn links_are_only_ever_http_or_mailto() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    let out = import(
        &env,
        "news",
        "email,name,unsubscribe_url\n\
         a@example.test,A,javascript:alert(document.cookie)\n\
         b@example.test,B,https://prefs.example.test/leave?id=b\n\
         c@example.test,C,\" JaVaScRiPt:alert(1)\"\n\
         d@example.test,D,\"data:text/html,<script>alert(1)</script>\"\n\
         e@example.test,E,\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    for line in [2, 4, 5] {
        assert!(
            err.contains(&format!(
                "line {line}: unsubscribe_url must be an http(s) or mailto URL"
            )),
            "line {line}: {err}"
        );
    }
    assert!(stdout(&out).contains("added 2 "), "{}", stdout(&out));

    // Without --public-url, a recipient's own safe link is used (no
    // one-click: it is not ours to promise).
    assert!(env
        .try_create_campaign_from("c", "news", "news@example.test", &[])
        .status
        .success());
    let b = env.ok(&[
        "preview",
        "c",
        "--recipient",
        "b@example.test",
        "--real-links",
    ]);
    assert_eq!(
        header(&b, "List-Unsubscribe"),
        ["<https://prefs.example.test/leave?id=b>"]
    );
    assert!(header(&b, "List-Unsubscribe-Post").is_empty());
    assert!(
        b.contains("href=\"https://prefs.example.test/leave?id=b\""),
        "{b}"
    );

    // A value slipped into the database by hand is still never rendered.
    env.sql(
        "UPDATE recipients SET attributes = '{\"unsubscribe_url\":\"javascript:alert(1)\"}' \
         WHERE email = 'e@example.test'",
    );
    let e = env.ok(&[
        "preview",
        "c",
        "--recipient",
        "e@example.test",
        "--real-links",
    ]);
    assert!(!e.to_ascii_lowercase().contains("javascript"), "{e}");
    assert!(
        e.contains("href=\"mailto:news@example.test?subject=unsubscribe\""),
        "{e}"
    );

    // With --public-url the campaign's one-click link replaces the
    // attribute everywhere.
    assert!(env
        .try_create_campaign_from(
            "oneclick",
            "news",
            "news@example.test",
            &["--public-url", "https://mail.example.test"]
        )
        .status
        .success());
    let b = env.ok(&[
        "preview",
        "oneclick",
        "--recipient",
        "b@example.test",
        "--real-links",
    ]);
    assert!(!b.contains("prefs.example.test"), "{b}");
    assert!(header(&b, "List-Unsubscribe")[0].starts_with("<https://mail.example.test/u/"));
}

#[test]
fn a_hostile_list_name_adds_no_header() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    let list = "vip\r\nBcc: victim@evil.test\r\nX-Evil: 1";
    let out = import(&env, list, "email,name\nada@example.test,Ada\n");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(env
        .try_create_campaign_from("c", list, "news@example.test", &[])
        .status
        .success());
    let m = env.ok(&["preview", "c"]);
    let head = &m[..m.find("\r\n\r\n").unwrap()];
    assert!(
        !head.contains("\r\nBcc:") && !head.contains("\r\nX-Evil:"),
        "{head}"
    );
    let id = header(&m, "List-Id");
    assert_eq!(id.len(), 1, "{head}");
    assert!(id[0].ends_with(".example.test>"), "{head}");
    let feedback = header(&m, "Feedback-ID");
    assert_eq!(feedback[0].matches(':').count(), 3, "{head}");
}
