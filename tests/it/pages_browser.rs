//! The sign-up form, the confirmation and the preference centre in
//! Debian's headless Chromium over WebDriver (chromedriver), against the
//! real `serve`, a worker, beanstalkd and SQLite. Screenshots go to
//! `$MAILSPLIT_SCREENSHOTS` when it is set (docs/screenshots/).

use fantoccini::Locator;

use crate::dashboard::{browser, chromedriver, click, screenshot, text};
use crate::util::*;

fn members(env: &Env, list: &str) -> String {
    let out = env.ok(&["list", "ls"]);
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(list))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

#[test]
fn subscribe_confirm_and_preferences_in_chromium() {
    let env = World::with_peer(
        Kind::Sqlite,
        Script {
            keep_data: true,
            ..Script::default()
        },
    )
    .var("MAILSPLIT_PUBLIC_URL", "http://127.0.0.1:9");
    env.ok(&["migrate"]);
    env.ok(&[
        "list",
        "create",
        "weekly",
        "--public",
        "--double-opt-in",
        "--title",
        "The weekly letter",
    ]);
    env.ok(&["list", "create", "offers", "--public", "--title", "Offers"]);
    let served = env.serve(None);
    let _w = env.worker(&[]);
    let (_driver, port) = chromedriver();
    let base = format!("http://127.0.0.1:{}", served.public);
    let profile = env.dir.path().join("profile");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = browser(port, &profile).await;
        c.goto(&format!("{base}/subscribe")).await.unwrap();
        c.find(Locator::Css("#email"))
            .await
            .unwrap()
            .send_keys("ann@example.test")
            .await
            .unwrap();
        c.find(Locator::Css("#name"))
            .await
            .unwrap()
            .send_keys("Ann")
            .await
            .unwrap();
        click(&c, "input[value='weekly']").await;
        click(&c, "input[value='offers']").await;
        screenshot(&c, "subscribe.png").await;
        click(&c, "button[type='submit']").await;
        let body = text(&c, "h1").await.unwrap_or_default();
        assert_eq!(body, "Check your inbox");
        assert_eq!(members(&env, "offers"), "1");
        assert_eq!(members(&env, "weekly"), "0");

        wait_for(30, "the confirmation mail", || {
            !env.peer().messages.lock().unwrap().is_empty()
        });
        let mail = env.peer().messages.lock().unwrap()[0].1.clone();
        let p = parts(&mail);
        let at = p
            .text
            .find("http://127.0.0.1:9/confirm/")
            .expect("a confirm link");
        let path: String = p.text[at + "http://127.0.0.1:9".len()..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect();
        c.goto(&format!("{base}{path}")).await.unwrap();
        screenshot(&c, "confirm.png").await;
        assert_eq!(members(&env, "weekly"), "0", "the GET confirms nothing");
        click(&c, "button[type='submit']").await;
        wait_for(10, "the confirmation", || members(&env, "weekly") == "1");

        let ann = mailsplit::store::recipients::find_by_email(&mut env.conn(), "ann@example.test")
            .unwrap()
            .unwrap();
        let token = env.identity().signer.preferences_token(1, ann);
        c.goto(&format!("{base}/p/{token}")).await.unwrap();
        click(&c, "input[value='offers']").await;
        screenshot(&c, "preferences.png").await;
        click(&c, "button[type='submit']").await;
        wait_for(10, "the saved preferences", || {
            members(&env, "offers") == "0"
        });
        assert_eq!(members(&env, "weekly"), "1");
        let saved = text(&c, "#saved").await.unwrap_or_default();
        assert_eq!(saved, "Saved.");
        c.close().await.unwrap();
    });
}
