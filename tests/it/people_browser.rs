//! Issue 41's subscriber search in Debian's headless Chromium over
//! WebDriver, against the real `serve` and SQLite: among 100,000
//! recipients (a generated CSV through the real `mailsplit import`), the
//! search form finds an address by its prefix, its page leads to forget,
//! which asks first; afterwards no search finds the person, the database
//! files hold the address nowhere, and everyone else is still there.
//!
//! How long the search takes is a figure, not a pass mark (BENCHMARKS.md,
//! "Subscriber search by address prefix"; `scripts/bench.py
//! --search-serve`): this test prints the seeding time and the median
//! answer of `GET /subscribers?q=…` as its client saw them.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use mailsplit::store::{lists, people};

use crate::dashboard::{browser, chromedriver, click, log_in, wait_text};
use crate::forget::dump;
use crate::util::*;

const TOKEN: &str = "people-browser-token";
const PEOPLE: usize = 100_000;
/// The one forgotten; `user42420` … `user42429` share its prefix.
const GONE: &str = "user4242@example.test";

/// Type `prefix` into the search form and send it.
async fn search(c: &Client, prefix: &str) {
    let field = c.find(Locator::Css("#q")).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(prefix).await.unwrap();
    click(c, "form.search button").await;
    wait_text(c, 10, "#results", |t| t.contains(prefix)).await;
}

/// The addresses the results table shows.
async fn hits(c: &Client) -> Vec<String> {
    let mut shown = Vec::new();
    for a in c
        .find_all(Locator::Css("table.hits td.name a"))
        .await
        .unwrap()
    {
        shown.push(a.text().await.unwrap());
    }
    shown
}

/// Median time of `n` searches for `prefix` as an HTTP client sees them.
fn median_search(port: u16, prefix: &str, n: usize) -> Duration {
    let auth = format!("Bearer {TOKEN}");
    let path = format!("/subscribers?q={prefix}");
    let mut took: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let r = http("GET", port, &path, &[("Authorization", &auth)], None);
            assert_eq!(r.status, 200, "{}", r.body);
            t.elapsed()
        })
        .collect();
    took.sort();
    took[n / 2]
}

#[test]
fn find_one_among_100k_and_forget_them_in_chromium() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    let seeding = Instant::now();
    env.import_n("customers", PEOPLE);
    eprintln!("seeded {PEOPLE} recipients in {:?}", seeding.elapsed());
    let served = env.serve(Some(TOKEN));
    eprintln!(
        "GET /subscribers?q=user4242 at {PEOPLE}: median {:?} of 21",
        median_search(served.admin, "user4242", 21)
    );
    let (_driver, port) = chromedriver();
    let base = format!("http://127.0.0.1:{}", served.admin);
    let profile = env.dir.path().join("profile");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = browser(port, &profile).await;
        c.goto(&format!("{base}/")).await.unwrap();
        log_in(&c, TOKEN).await;
        wait_text(&c, 10, "nav.site", |t| t.contains("Subscribers")).await;
        click(&c, "nav.site a[href='/subscribers']").await;

        // The prefix finds the person and the ten who share it.
        search(&c, "user4242").await;
        let found = hits(&c).await;
        assert_eq!(found.len(), 11, "{found:?}");
        assert!(found.iter().any(|h| h == GONE), "{found:?}");

        // Their page, forget, the confirmation, then the search page.
        c.find(Locator::LinkText(GONE))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_text(&c, 10, "#who", |t| t.contains(GONE)).await;
        click(&c, "#forget").await;
        wait_text(&c, 10, "#ask", |t| t.contains(GONE)).await;
        click(&c, "#confirm-forget").await;
        wait_text(&c, 10, "#forgotten", |t| t.contains("was forgotten")).await;

        search(&c, "user4242").await;
        let left = hits(&c).await;
        assert_eq!(left.len(), 10, "{left:?}");
        assert!(!left.iter().any(|h| h == GONE), "{left:?}");
        search(&c, "user4242@").await;
        assert!(hits(&c).await.is_empty());
        wait_text(&c, 10, "p.empty", |t| t.contains("No subscriber")).await;
        c.close().await.unwrap();
    });

    // The store: the address nowhere in the database's files; everyone
    // else still on the list.
    assert!(!dump(&env).contains(GONE), "the address is still stored");
    let mut conn = env.conn();
    assert!(people::search(&mut conn, "user4242@", None, 5)
        .unwrap()
        .is_empty());
    let list = lists::overview(&mut conn).unwrap();
    let customers = list.iter().find(|l| l.name == "customers").unwrap();
    assert_eq!(customers.members, PEOPLE as i64 - 1);
    assert_eq!(customers.active, PEOPLE as i64 - 1);
}
