//! A campaign written and sent from the dashboard in Debian's headless
//! Chromium over WebDriver, against the real `serve`, a worker,
//! beanstalkd, a scripted SMTP peer and SQLite: created from pasted
//! Markdown, previewed for a chosen member, test-sent (the peer gets
//! `[TEST] …`), scheduled, paused, its subject fixed, resumed; the worker
//! sends it to the end, every recipient exactly once (peer and ledger),
//! all with the fixed subject.

use fantoccini::{Client, Locator};

use crate::dashboard::{browser, chromedriver, click, log_in, screenshot, text, wait_text};
use crate::util::*;

const TOKEN: &str = "campaign-browser-token";
const MEMBERS: usize = 12;

async fn fill(c: &Client, css: &str, value: &str) {
    let e = c.find(Locator::Css(css)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(value).await.unwrap();
}

/// The document's scroll width and the window's width, in CSS pixels.
async fn widths(c: &Client) -> (i64, i64) {
    let v = c
        .execute(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];",
            vec![],
        )
        .await
        .unwrap();
    (v[0].as_i64().unwrap(), v[1].as_i64().unwrap())
}

/// The elements that reach past the window's right edge (what a failing
/// width check shows).
async fn wider(c: &Client) -> String {
    let v = c
        .execute(
            "const w = document.documentElement.clientWidth; return [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > w + 1).slice(0, 12).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).join(', ');",
            vec![],
        )
        .await
        .unwrap();
    v.as_str().unwrap_or_default().to_string()
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
        log_in(&c, TOKEN).await;
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

        // The dashboard's row with its buttons fits 1280 px.
        c.set_window_size(1280, 900).await.unwrap();
        c.goto(&format!("{base}/")).await.unwrap();
        wait_text(&c, 10, "td.actions", |t| {
            t.contains("Pause") && t.contains("Cancel")
        })
        .await;
        let (scroll, client) = widths(&c).await;
        assert!(scroll <= client, "{scroll} > {client}: {}", wider(&c).await);

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
        wait_done(&env, "spring", 60);

        // The dashboard at 1280 px: the whole table, no horizontal
        // scroll; at 360 and 1920 neither.
        for width in [1280, 360, 1920] {
            c.set_window_size(width, 900).await.unwrap();
            c.goto(&format!("{base}/")).await.unwrap();
            wait_text(&c, 10, "td.name", |t| t.contains("spring")).await;
            screenshot(&c, &format!("campaign-table-{width}.png")).await;
            let (scroll, client) = widths(&c).await;
            assert!(
                scroll <= client,
                "{width} px: {scroll} > {client}: {}",
                wider(&c).await
            );
        }
        c.set_window_size(1280, 900).await.unwrap();
        c.goto(&page_url).await.unwrap();
        let (scroll, client) = widths(&c).await;
        assert!(scroll <= client, "campaign page: {scroll} > {client}");

        // Archived: off the dashboard, on the archived list, and back.
        assert!(text(&c, "p.send-at, section.schedule p")
            .await
            .is_some_and(|t| !t.contains("nothing leaves before")));
        click(&c, "button.archive").await;
        wait_text(&c, 10, "p.new-campaign", |t| {
            t.contains("Archived campaigns (1)")
        })
        .await;
        assert!(text(&c, "td.name").await.is_none());
        click(&c, "p.new-campaign a[href='/campaigns/archived']").await;
        wait_text(&c, 10, "table.archived td.name", |t| t == "spring").await;
        click(&c, "button.unarchive").await;
        wait_text(&c, 10, "p.empty", |t| t.contains("No archived campaigns")).await;
        page_url
    });

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
