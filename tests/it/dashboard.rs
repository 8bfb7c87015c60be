//! The dashboard in a real browser: Debian's `chromium`, headless, driven
//! over WebDriver by Debian's `chromedriver` (crate `fantoccini`), against
//! a real `serve`, workers, beanstalkd and the scripted SMTP peer. Without
//! the token the page refuses; logged in, a running campaign's progress
//! grows without a reload, Pause stops the SMTP peer and sets the database
//! flag, Resume lets the campaign finish.
//!
//! With `MAILSPLIT_SCREENSHOTS=DIR` the test saves what it sees as PNGs
//! there (the README's pictures come from such a run).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

const TOKEN: &str = "dashboard-test-token";

/// chromedriver on a free port.
pub(crate) fn chromedriver() -> (Proc, u16) {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver is not installed: run scripts/install-deps.sh (chromium-driver)");
    wait_port(port);
    (Proc(child), port)
}

/// A headless chromium with a fresh profile, nothing fetched from outside.
pub(crate) async fn browser(driver: u16, profile: &std::path::Path) -> Client {
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect::<Vec<_>>();
    let caps = json!({"goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}});
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps.as_object().unwrap().clone())
        .connect(&format!("http://127.0.0.1:{driver}"))
        .await
        .expect("chromium does not start under chromedriver")
}

pub(crate) async fn text(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// Wait until `css` shows text for which `ok` holds; the dashboard swaps
/// its live part every 2 s, so elements come and go.
pub(crate) async fn wait_text(
    c: &Client,
    secs: u64,
    css: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(t) = text(c, css).await {
            if ok(&t) {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting on {css}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Log in on the page the browser shows (the login form): type `token`
/// and submit.
pub async fn log_in(c: &Client, token: &str) {
    let field = c.find(Locator::Css("input[name=token]")).await.unwrap();
    field.send_keys(token).await.unwrap();
    click(c, "form button").await;
}

/// Click `css`, retrying when the live refresh replaced the element
/// between finding and clicking it.
pub(crate) async fn click(c: &Client, css: &str) {
    for _ in 0..20 {
        if let Ok(e) = c.find(Locator::Css(css)).await {
            if e.click().await.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("cannot click {css}");
}

pub(crate) async fn screenshot(c: &Client, name: &str) {
    let Some(dir) = std::env::var_os("MAILSPLIT_SCREENSHOTS").map(PathBuf::from) else {
        return;
    };
    let png = c.screenshot().await.unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
}

fn number(s: &str) -> i64 {
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

#[test]
fn dashboard_in_chromium_pauses_and_resumes_a_running_campaign() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        data_delay: Duration::from_millis(100),
        reject_every: Some(25),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Sqlite, &bs.addr());
    env.smtp = peer.url();
    env.campaign("spring-news", 1_000);
    env.create_campaign("summer-sale", "spring-news", &[]);
    env.ok(&["rate", "set", "domain:example.test", "200/s"]);
    let served = env.serve(Some(TOKEN));
    let _workers = [
        env.worker(&["--concurrency", "2"]),
        env.worker(&["--concurrency", "2"]),
    ];
    let (_driver, driver_port) = chromedriver();
    let base = format!("http://127.0.0.1:{}", served.admin);
    let row = "tr[data-campaign='spring-news']";
    let paused_in_db = || {
        mailsplit::store::campaigns::find(&mut env.conn(), "spring-news")
            .unwrap()
            .paused
    };

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = browser(driver_port, &tmp.path().join("profile")).await;

        // Without the token the page refuses: a login form, no figures.
        c.goto(&format!("{base}/")).await.unwrap();
        let body = text(&c, "body").await.unwrap();
        assert!(body.contains("admin token"), "{body}");
        assert!(!body.contains("spring-news"), "{body}");
        screenshot(&c, "login.png").await;
        c.goto(&format!("{base}/api/campaigns")).await.unwrap();
        let body = text(&c, "body").await.unwrap();
        assert!(body.contains("admin token"), "{body}");
        assert!(!body.contains("spring-news"), "{body}");
        c.goto(&format!("{base}/")).await.unwrap();
        log_in(&c, "not-the-token").await;
        wait_text(&c, 10, "p.error", |t| t.contains("not the admin token")).await;

        // The token lets us in.
        log_in(&c, TOKEN).await;
        wait_text(&c, 10, &format!("{row} td.name"), |t| {
            t.contains("spring-news")
        })
        .await;

        // Progress grows on its own, without a reload of the page.
        c.execute("window.notReloaded = true; return 1", vec![])
            .await
            .unwrap();
        let first = number(&wait_text(&c, 30, &format!("{row} td.sent"), |t| number(t) > 0).await);
        let later = number(
            &wait_text(&c, 30, &format!("{row} td.sent"), |t| {
                number(t) >= first + 40
            })
            .await,
        );
        assert!(later > first);
        let kept = c
            .execute("return window.notReloaded === true", vec![])
            .await
            .unwrap();
        assert_eq!(
            kept,
            json!(true),
            "the page was reloaded instead of refreshed"
        );
        wait_text(&c, 10, "table.workers tbody", |t| {
            t.matches("running").count() == 2
        })
        .await;
        // The campaign's current rate and ETA appear once a rate window closed.
        wait_text(&c, 30, &format!("{row} td.rate"), |t| t != "0.0").await;
        wait_text(&c, 10, &format!("{row} td.eta"), |t| t != "-").await;
        screenshot(&c, "dashboard.png").await;

        // Pause: the flag is set, the state shows, the SMTP peer goes quiet.
        click(&c, &format!("{row} button.pause")).await;
        wait_text(&c, 10, &format!("{row} .state"), |t| t == "paused").await;
        assert!(paused_in_db(), "the database flag is set");
        // Messages already on the wire land, then the workers hand every
        // job back with a delay; then a whole round of the pause (every job
        // back from its delay and handed back again) sends nothing.
        let handed_back = || {
            bs.tube_stat(&env.tube, "current-jobs-reserved") == 0
                && bs.tube_stat(&env.tube, "current-jobs-ready") == 0
                && bs.tube_stat(&env.tube, "current-jobs-delayed") > 0
        };
        wait_until(30, "the workers to hand every job back", handed_back).await;
        let quiet_from = peer.total();
        let (jobs, released) = (
            bs.tube_stat(&env.tube, "current-jobs-delayed"),
            bs.stat("cmd-release"),
        );
        wait_until(30, "every job handed back once more", || {
            bs.stat("cmd-release") >= released + jobs
        })
        .await;
        assert_eq!(peer.total(), quiet_from, "mail went out while paused");
        assert!(quiet_from < 960, "finished before the pause ({quiet_from})");
        wait_text(&c, 10, &format!("{row} button.resume"), |t| t == "Resume").await;
        screenshot(&c, "dashboard-paused.png").await;

        // Resume: it goes on and finishes.
        click(&c, &format!("{row} button.resume")).await;
        wait_text(&c, 10, &format!("{row} .state"), |t| {
            t == "sending" || t == "done"
        })
        .await;
        assert!(!paused_in_db());
        wait_text(&c, 180, &format!("{row} .state"), |t| t == "done").await;
        let pending = text(&c, &format!("{row} td.pending")).await.unwrap();
        assert_eq!(number(&pending), 0);
        c.close().await.unwrap();
    });
    let status = env.status("spring-news");
    assert_eq!(status["pending"], 0);
    assert_eq!(
        peer.total() as i64,
        status["sent"].as_i64().unwrap(),
        "each accepted message recorded once"
    );
    assert_eq!(peer.duplicates(), 0);
}

/// Poll a blocking condition (beanstalkd stats) without blocking the runtime
/// for long: up to `secs` seconds, every 50 ms.
async fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
