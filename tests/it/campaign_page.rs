//! The dashboard's campaign page, over real HTTP with
//! the admin token and in Debian's headless chromium: the current content
//! rendered for the first active list member inside a sandboxed frame, the
//! subject, the version history with the recipients sent each version, the
//! schedule. A template whose HTML holds `</iframe><script>` stays inside
//! the frame and runs nothing.

use fantoccini::Locator;
use serde_json::json;

use crate::dashboard::{browser, chromedriver, click, log_in, screenshot, text, wait_text};
use crate::util::*;

const TOKEN: &str = "campaign-page-token";

/// What the hostile template does if it ever runs: in the frame, mark the
/// body; in the page, change its title. Its `</iframe>` sits in a script's
/// raw text, which the CSS inliner keeps as it is: a page that did not
/// escape it would close the frame there and show the rest as its own.
const HOSTILE: &str = "<html><head><style>p.hi { color: #ff0000; }</style></head><body>\n\
<p class=\"hi\">Hello {{ name }} from {{ attributes.city }}</p>\n\
<script>/* </iframe><p class=\"escaped\">out</p><img src=\"x\" onerror=\"parent.document.title = 'pwned'\"> */\n\
document.body.setAttribute('data-ran', 'yes'); parent.document.title = 'pwned';</script>\n\
<p class=\"bye\"><a href=\"{{ unsubscribe_url }}\">Leave</a></p>\n</body></html>\n";

/// A list whose first member is inactive and whose second has a name that
/// must show as text; a campaign with two content versions, the second
/// one hostile; ledger rows saying who got which version.
fn setup_campaign(env: &Env) -> i64 {
    let csv = "email,name,city\n\
               gone@example.test,Gone,Rome\n\
               bob@example.test,<b>Bob</b>,Paris\n\
               carol@example.test,Carol,Oslo\n";
    let path = env.dir.path().join("news.csv");
    std::fs::write(&path, csv).unwrap();
    env.ok(&["migrate"]);
    env.ok(&["import", path.to_str().unwrap(), "--list", "news"]);
    env.sql("UPDATE recipients SET status = 'unsubscribed' WHERE email = 'gone@example.test'");
    let first = env.dir.path().join("v1.html");
    std::fs::write(&first, "<p>First version for {{ email }}</p>\n").unwrap();
    env.ok(&[
        "campaign",
        "create",
        "weekly",
        "--list",
        "news",
        "--html",
        first.to_str().unwrap(),
        "--subject",
        "First news",
        "--from",
        "news@example.test",
    ]);
    let second = env.dir.path().join("v2.html");
    std::fs::write(&second, HOSTILE).unwrap();
    env.ok(&[
        "campaign",
        "edit",
        "weekly",
        "--html",
        second.to_str().unwrap(),
        "--subject",
        "News for {{ name }}",
    ]);
    let id = env.status("weekly")["id"].as_i64().unwrap();
    // Two recipients got version 1, one version 2 (as a pause → edit →
    // resume leaves it; see tests/it/edit.rs for the real thing).
    env.sql(&format!(
        "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at, content_version) \
         SELECT {id}, id, 'sent', 1, 0, CASE WHEN email = 'carol@example.test' THEN 2 ELSE 1 END \
         FROM recipients"
    ));
    id
}

fn get(port: u16, path: &str, token: Option<&str>) -> Http {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    http("GET", port, path, &headers, None)
}

fn page_over_http(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    let id = setup_campaign(&env);
    assert_eq!(env.status("weekly")["send_at"], serde_json::Value::Null);
    let start = mailsplit::store::now_ms() + 3_600_000;
    let start =
        mailsplit::clock::rfc3339(start - start % 1000, mailsplit::clock::Precision::AsNeeded);
    env.ok(&["campaign", "edit", "weekly", "--send-at", &start]);
    assert_eq!(env.status("weekly")["send_at"], start.as_str());
    let served = env.serve(Some(TOKEN));
    let path = format!("/campaigns/{id}");

    assert_eq!(get(served.admin, &path, None).status, 401);
    assert_eq!(get(served.admin, &path, Some("wrong")).status, 401);
    let page = get(served.admin, &path, Some(TOKEN));
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;

    // The dashboard links each campaign to its page.
    let dashboard = get(served.admin, "/", Some(TOKEN));
    assert!(
        dashboard
            .body
            .contains(&format!("starts <time datetime=\"{start}\">")),
        "{}",
        dashboard.body
    );
    assert!(
        dashboard.body.contains(&format!("href=\"{path}\"")),
        "{}",
        dashboard.body
    );

    // Rendered for the first *active* member, whose name stays text: the
    // subject escaped once (by this page), the HTML part twice (by the
    // template, then into srcdoc).
    assert!(body.contains("<code>bob@example.test</code>"), "{body}");
    assert!(
        body.contains("<strong>News for &#60;b&#62;Bob&#60;/b&#62;</strong>")
            || body.contains("<strong>News for &lt;b&gt;Bob&lt;/b&gt;</strong>"),
        "{body}"
    );
    assert!(!body.contains("<b>Bob</b>"), "{body}");
    assert!(body.contains("Paris"), "{body}");

    // The hostile content: exactly one frame, sandboxed, nothing of the
    // content outside it, no script on the page at all.
    assert_eq!(body.matches("<iframe").count(), 1, "{body}");
    assert_eq!(body.matches("</iframe>").count(), 1, "{body}");
    assert!(body.contains("sandbox=\"\""), "{body}");
    assert!(!body.to_ascii_lowercase().contains("<script"), "{body}");
    let frame = &body[body.find("<iframe").unwrap()..body.find("</iframe>").unwrap()];
    let srcdoc = frame.split("srcdoc=\"").nth(1).expect("a srcdoc attribute");
    let srcdoc = &srcdoc[..srcdoc.find('"').expect("the attribute's end")];
    assert!(
        srcdoc.contains("&#60;/iframe&#62;") || srcdoc.contains("&lt;/iframe&gt;"),
        "the frame's closing tag is inside, escaped: {frame}"
    );
    assert!(
        srcdoc.starts_with("&"),
        "the document is escaped into the attribute: {frame}"
    );
    assert!(!srcdoc.contains('<') && !srcdoc.contains('>'), "{frame}");
    assert!(
        srcdoc.contains("script"),
        "the hostile part is inside: {frame}"
    );
    // What comes after the frame is still this page's.
    let after = &body[body.find("</iframe>").unwrap()..];
    assert!(after.contains("<section class=\"versions\">"), "{after}");

    // Its own policy: no script anywhere, no remote images; never framed.
    let csp = page.header("content-security-policy").unwrap();
    assert!(
        csp.contains("default-src 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"));

    // Version history: newest first, with who got which.
    let v2 = body.find("data-version=\"2\"").expect("version 2 listed");
    let v1 = body.find("data-version=\"1\"").expect("version 1 listed");
    assert!(v2 < v1, "newest first");
    let row = |at: usize| &body[at..at + body[at..].find("</tr>").unwrap()];
    assert!(row(v2).contains("News for {{ name }}"), "{}", row(v2));
    assert!(row(v2).contains("current"), "{}", row(v2));
    assert!(
        row(v2).contains("<td class=\"num sent\">1</td>"),
        "{}",
        row(v2)
    );
    assert!(
        row(v1).contains("<td class=\"num sent\">2</td>"),
        "{}",
        row(v1)
    );
    assert!(row(v1).contains("First news"), "{}", row(v1));

    // Schedule and progress.
    assert!(
        body.contains(&format!(
            "Sends at <time class=\"send-at\" datetime=\"{start}\">"
        )),
        "{body}"
    );
    assert!(
        body.contains("<span class=\"state scheduled\">scheduled</span>"),
        "{body}"
    );
    assert!(body.contains("role=\"progressbar\""), "{body}");
    assert!(body.contains("aria-valuemin=\"0\"") && body.contains("aria-valuemax=\"100\""));

    // No such campaign.
    assert_eq!(
        get(served.admin, "/campaigns/99999", Some(TOKEN)).status,
        404
    );
    assert_eq!(
        get(served.admin, "/campaigns/weekly", Some(TOKEN)).status,
        404
    );
}

both!(page_over_http);

/// In chromium: the page shows the preview in its frame with the
/// content's own (inlined) style; the script in it never ran, in the
/// frame or in the page; the page's own parts are all there.
#[test]
fn page_in_chromium_keeps_hostile_content_in_its_frame() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    let id = setup_campaign(&env);
    let served = env.serve(Some(TOKEN));
    let (_driver, driver_port) = chromedriver();
    let base = format!("http://127.0.0.1:{}", served.admin);
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = browser(driver_port, &tmp.path().join("profile")).await;
        c.goto(&format!("{base}/")).await.unwrap();
        log_in(&c, TOKEN).await;
        wait_text(&c, 10, "td.name", |t| t.contains("weekly")).await;
        // From the dashboard's row to the page (the live refresh may
        // replace the row between finding and clicking it: `click` retries).
        click(&c, "td.name a").await;
        wait_text(&c, 10, "section.versions", |t| t.contains("News for")).await;
        assert_eq!(
            c.current_url().await.unwrap().path(),
            format!("/campaigns/{id}")
        );
        screenshot(&c, "campaign.png").await;

        let title = c.title().await.unwrap();
        assert_eq!(title, "mailsplit: weekly");
        let page = c
            .execute(
                "return [document.querySelectorAll('script').length, \
                 document.querySelectorAll('iframe').length, \
                 document.querySelectorAll('p.hi, p.bye, p.escaped, img').length]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(page, json!([0, 1, 0]), "the content stayed in its frame");
        let bar = c.find(Locator::Css("[role=progressbar]")).await.unwrap();
        assert_eq!(
            bar.attr("aria-valuemax").await.unwrap().as_deref(),
            Some("100")
        );

        // Inside the frame: the content, styled, its script never run.
        let frame = c.find(Locator::Css("iframe.preview")).await.unwrap();
        frame.enter_frame().await.unwrap();
        let hi = c.find(Locator::Css("p.hi")).await.unwrap();
        assert_eq!(hi.text().await.unwrap(), "Hello <b>Bob</b> from Paris");
        assert_eq!(hi.css_value("color").await.unwrap(), "rgba(255, 0, 0, 1)");
        let ran = c
            .find(Locator::Css("body"))
            .await
            .unwrap()
            .attr("data-ran")
            .await
            .unwrap();
        assert_eq!(ran, None, "a script ran inside the preview");
        c.enter_parent_frame().await.unwrap();
        assert_eq!(c.title().await.unwrap(), "mailsplit: weekly");
        assert!(text(&c, "section.schedule")
            .await
            .unwrap()
            .contains("Not scheduled"));
        c.close().await.unwrap();
    });
}
