//! Accessibility: axe-core (the npm package, pinned, installed by
//! scripts/install-deps.sh) run in Debian's headless chromium over every
//! admin page, the login form and the public pages of a real `serve`
//! after a real send; any `serious` or `critical` violation fails. The
//! script goes in through WebDriver (DevTools evaluation), so the pages'
//! policy (no inline script) stays as served.
//!
//! A new page joins by adding its path to [`ADMIN_PAGES`] or
//! [`PUBLIC_PAGES`] (`{campaign}`, `{flow}`, `{preferences}` and `{view}`
//! stand for what the test made).

use std::path::PathBuf;

use crate::dashboard::{browser, chromedriver, log_in, screenshot};
use crate::manage::onboarding_flow;
use crate::pages::{link, sent_to_both, world};
use crate::util::*;
use fantoccini::{Client, Locator};

/// Admin pages, visited logged in.
pub const ADMIN_PAGES: &[&str] = &[
    "/",
    "/campaigns/{campaign}",
    "/flows",
    "/flows/{flow}",
    "/apikeys",
    "/webhooks",
    "/suppression",
    "/dkim",
    "/lists",
    "/templates",
    "/templates/welcome",
    "/campaigns/new",
    "/campaigns/{campaign}/edit",
    "/campaigns/archived",
    "/subscribers",
    "/subscribers?q=ann",
    "/subscribers/ann@example.test",
    "/subscribers/ann@example.test/forget",
];

/// Public pages.
pub const PUBLIC_PAGES: &[&str] = &["/subscribe", "{preferences}", "{view}"];

/// Widths every page is checked at (a phone, a laptop, a wide screen).
pub const WIDTHS: &[u32] = &[360, 1280, 1920];

/// The admin pages pictured, as `NAME-WIDTH.png`, when
/// `MAILSPLIT_SCREENSHOTS=DIR` is set (`scripts/screenshots.sh`).
const PICTURED: &[(&str, &str)] = &[
    ("/", "dashboard"),
    ("/campaigns/{campaign}", "campaign"),
    ("/apikeys", "apikeys"),
    ("/suppression", "suppression"),
    ("/dkim", "dkim"),
];

const TOKEN: &str = "axe-test-token";

/// axe-core's script, where scripts/install-deps.sh put it.
fn axe_source() -> String {
    let path = std::env::var_os("MAILSPLIT_AXE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/share/axe-core/current/axe.min.js"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/install-deps.sh (it installs axe-core from the npm registry) or set MAILSPLIT_AXE",
            path.display()
        )
    })
}

/// Run axe on the page `c` shows: its serious and critical violations,
/// one line each (rule, impact, the first offending elements).
async fn violations(c: &Client, axe: &str) -> Vec<String> {
    c.execute(&format!("{axe}\n;return 1;"), vec![])
        .await
        .expect("axe-core loads");
    let run = r#"
        const done = arguments[arguments.length - 1];
        axe.run(document, {resultTypes: ['violations']}).then(r => done(
            r.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => v.id + ' (' + v.impact + '): ' + v.help + ' at ' +
                    v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '))
        )).catch(e => done(['axe failed: ' + e]));
    "#;
    let found = c.execute_async(run, vec![]).await.expect("axe runs");
    serde_json::from_value(found).expect("a list of violations")
}

/// Which pages carry the admin pages' navigation in their header.
#[derive(Clone, Copy, PartialEq)]
enum Nav {
    Shown,
    None,
}

async fn check(
    c: &Client,
    axe: &str,
    (url, nav): (&str, Nav),
    width: u32,
    found: &mut Vec<String>,
) {
    c.set_window_size(width, 900).await.unwrap();
    c.goto(url).await.unwrap();
    if nav == Nav::Shown && c.find(Locator::Css("header nav.site")).await.is_err() {
        found.push(format!("{url}: no navigation in its header"));
    }
    for v in violations(c, axe).await {
        found.push(format!("{url} at {width}px: {v}"));
    }
}

#[test]
fn every_page_passes_axe_core() {
    let axe = axe_source();
    let env = world(Kind::Sqlite);
    let (ann_mail, _) = sent_to_both(&env);
    let html = parts(&ann_mail).html;
    let (preferences, view) = (link(&html, "p"), link(&html, "v"));
    onboarding_flow(&env, "news");
    env.ok(&["suppress", "add", "gone@example.test", "--reason", "asked"]);
    env.ok(&["apikey", "create", "shop", "--scopes", "read"]);
    env.ok(&["dkim", "keygen", "example.test"]);
    let campaign = env.status("first")["id"].as_i64().unwrap().to_string();
    let fill = |p: &str| {
        p.replace("{campaign}", &campaign)
            .replace("{flow}", "onboarding")
            .replace("{preferences}", &preferences)
            .replace("{view}", &view)
    };

    let served = env.serve(Some(TOKEN));
    let (_driver, port) = chromedriver();
    let admin = format!("http://127.0.0.1:{}", served.admin);
    let public = format!("http://127.0.0.1:{}", served.public);
    let profile = env.dir.path().join("profile");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let found = rt.block_on(async {
        let c = browser(port, &profile).await;
        let mut found = Vec::new();
        for &width in WIDTHS {
            // The login form first (no session yet), then log in.
            check(
                &c,
                &axe,
                (&format!("{admin}/"), Nav::None),
                width,
                &mut found,
            )
            .await;
        }
        log_in(&c, TOKEN).await;
        for &width in WIDTHS {
            for page in ADMIN_PAGES {
                check(
                    &c,
                    &axe,
                    (&format!("{admin}{}", fill(page)), Nav::Shown),
                    width,
                    &mut found,
                )
                .await;
                if let Some((_, name)) = PICTURED.iter().find(|(p, _)| p == page) {
                    screenshot(&c, &format!("{name}-{width}.png")).await;
                }
            }
            for page in PUBLIC_PAGES {
                check(
                    &c,
                    &axe,
                    (&format!("{public}{}", fill(page)), Nav::None),
                    width,
                    &mut found,
                )
                .await;
            }
        }
        c.close().await.unwrap();
        found
    });
    assert!(found.is_empty(), "axe-core found:\n{}", found.join("\n"));
}

/// Every admin page's template shows the same navigation: it includes
/// `nav.html` or extends a layout that does; the login form (no session
/// yet) and the fragments other pages include are the exceptions.
#[test]
fn every_admin_template_carries_the_navigation() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/admin");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let page = std::fs::read_to_string(&path).unwrap_or_default();
        let whole = page.contains("<!DOCTYPE html>") || page.contains("{% extends");
        let navigated = page.contains("{% include \"admin/nav.html\" %}")
            || page.contains("{% extends \"admin/manage.html\" %}");
        if name.ends_with(".html") && whole && !navigated && name != "login.html" {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "admin pages without the navigation: {missing:?}"
    );
}
