//! A campaign written and sent from the dashboard in Debian's headless
//! Chromium over WebDriver, against the real `serve`, a worker,
//! beanstalkd, a scripted SMTP peer and SQLite: created from pasted
//! Markdown, previewed for a chosen member, test-sent (the peer gets
//! `[TEST] …`), scheduled, paused, its subject fixed, resumed; the worker
//! sends it to the end, every recipient exactly once (peer and ledger),
//! all with the fixed subject.

use fantoccini::{Client, Locator};

use crate::dashboard::{browser, chromedriver, click, screenshot, text, wait_text};
use crate::util::*;

const TOKEN: &str = "campaign-browser-token";
const MEMBERS: usize = 12;

async fn fill(c: &Client, css: &str, value: &str) {
    let e = c.find(Locator::Css(css)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(value).await.unwrap();
}

/// Sent rows in the ledger and distinct recipients among them.
fn ledger(env: &Env, campaign: i64) -> (i64, i64) {
    use diesel::sql_types::BigInt;
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        n: i64,
        #[diesel(sql_type = BigInt)]
        d: i64,
    }
    let path = env.db.url.strip_prefix("sqlite://").unwrap();
    let row: Row = diesel::sql_query(format!(
        "SELECT COUNT(*) AS n, COUNT(DISTINCT recipient_id) AS d FROM deliveries \
         WHERE campaign_id = {campaign} AND state = 'sent'"
    ))
    .get_result(&mut diesel::SqliteConnection::establish(path).unwrap())
    .unwrap();
    (row.n, row.d)
}

#[test]
fn write_test_schedule_pause_fix_resume_in_chromium() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            keep_data: true,
            ..Script::default()
        },
    );
    env.import_n("news", MEMBERS);
    let served = env.serve(Some(TOKEN));
    let _worker = env.worker(&[]);
    let (_driver, port) = chromedriver();
    let base = format!("http://127.0.0.1:{}", served.admin);
    let profile = env.dir.path().join("profile");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let page_url = rt.block_on(async {
        let c = browser(port, &profile).await;
        c.goto(&format!("{base}/")).await.unwrap();
        fill(&c, "input[name=token]", TOKEN).await;
        click(&c, "form button").await;
        // From the dashboard to the form; Markdown pasted.
        click(&c, "p.new-campaign a").await;
        fill(&c, "#f-name", "spring").await;
        c.find(Locator::Css("#f-list"))
            .await
            .unwrap()
            .select_by_value("news")
            .await
            .unwrap();
        fill(&c, "#f-subject", "Sprnig news").await;
        fill(&c, "#f-from", "Shop <shop@example.test>").await;
        fill(
            &c,
            "#f-content",
            "# Spring\n\nHello {{ email }}, the shop is open.\n",
        )
        .await;
        screenshot(&c, "campaign-new.png").await;
        click(&c, "button.primary").await;
        wait_text(&c, 10, "section.summary-box h2", |t| t.contains("spring")).await;
        let page_url = c.current_url().await.unwrap().to_string();
        assert!(text(&c, "p.no-sends").await.is_some());

        // Preview for a chosen member.
        fill(&c, "#f-member", "user7@example.test").await;
        click(&c, "form.preview-for button").await;
        wait_text(&c, 10, "p.for", |t| t.contains("user7@example.test")).await;
        let frame = c.find(Locator::Css("iframe.preview")).await.unwrap();
        let srcdoc = frame.attr("srcdoc").await.unwrap().unwrap_or_default();
        assert!(srcdoc.contains("Hello user7@example.test"), "{srcdoc}");

        // A test send.
        fill(&c, "#f-test-to", "qa@test.example").await;
        click(&c, "form.test button").await;
        wait_text(&c, 20, "p.outcome", |t| {
            t.contains("sent a test message to qa@test.example")
        })
        .await;
        c.goto(&page_url).await.unwrap();

        // Scheduled an hour ahead: enqueued, nothing leaves.
        let start = mailsplit::store::now_ms() + 3_600_000;
        let start =
            mailsplit::clock::rfc3339(start - start % 1000, mailsplit::clock::Precision::AsNeeded);
        fill(&c, "form.send #f-send-at", &start).await;
        click(&c, "form.send button").await;
        wait_text(&c, 10, "section.summary-box h2", |t| {
            t.contains("scheduled")
        })
        .await;
        wait_for(30, "the enqueue", || {
            env.status("spring")["enqueued"] == MEMBERS
        });

        // Pause, fix the subject (and start now), resume.
        c.goto(&page_url).await.unwrap();
        click(&c, "button.pause").await;
        wait_text(&c, 10, "section.summary-box h2", |t| t.contains("paused")).await;
        click(&c, "a.edit").await;
        fill(&c, "#f-subject", "Spring news").await;
        fill(&c, "#f-send-at", "now").await;
        click(&c, "button.primary").await;
        wait_text(&c, 10, "p.subject strong", |t| t == "Spring news").await;
        click(&c, "button.resume").await;
        page_url
    });
    wait_done(&env, "spring", 60);

    // Every member exactly once, with the fixed subject; the test message
    // went to its own address only.
    let s = env.status("spring");
    assert_eq!(s["sent"], MEMBERS, "{s}");
    assert_eq!(s["failed"], 0, "{s}");
    let peer = env.peer();
    assert_eq!(peer.duplicates(), 0);
    for i in 1..=MEMBERS {
        assert_eq!(peer.count(&format!("user{i}@example.test")), 1, "user{i}");
    }
    let id = s["id"].as_i64().unwrap();
    assert_eq!(ledger(&env, id), (MEMBERS as i64, MEMBERS as i64));
    let got = peer.messages.lock().unwrap().clone();
    assert_eq!(got.len(), MEMBERS + 1);
    for (to, message) in &got {
        let subject = parts(message).subject;
        match to[0].as_str() {
            "qa@test.example" => assert_eq!(subject, "[TEST] Sprnig news"),
            _ => assert_eq!(subject, "Spring news", "{to:?}"),
        }
    }
    assert!(
        page_url.ends_with(&format!("/campaigns/{id}")),
        "{page_url}"
    );
}
