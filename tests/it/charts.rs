//! The campaign page's charts: sent and failed per
//! minute as inline SVG bars that sum to the ledger, each with a caption,
//! a summary label and a data table; coarser buckets for a long campaign;
//! progress bars that are `role="progressbar"` with their values, on the
//! campaign page and in the dashboard's live part. Over HTTP on both
//! backends with a ledger written by hand, and in Debian's headless
//! chromium after a real send to a scripted SMTP sink.

use std::collections::BTreeMap;
use std::time::Duration;

use fantoccini::Locator;
use serde_json::{json, Value};

use crate::dashboard::{browser, chromedriver, log_in, screenshot};
use crate::util::*;

const TOKEN: &str = "charts-token";
const MINUTE: i64 = 60_000;
/// 2025-11-26 11:20:00 UTC.
const T0: i64 = 1_764_156_000_000;

fn get(port: u16, path: &str) -> Http {
    let bearer = format!("Bearer {TOKEN}");
    http("GET", port, path, &[("Authorization", &bearer)], None)
}

/// `(data-start-ms, data-count)` of every bar in the figure of `class`.
pub fn bars(body: &str, class: &str) -> Vec<(i64, i64)> {
    let open = format!("<figure class=\"chart {class}\">");
    let at = body
        .find(&open)
        .unwrap_or_else(|| panic!("no {class} chart: {body}"));
    let fig = &body[at..at + body[at..].find("</figure>").unwrap()];
    let attr = |s: &str, name: &str| -> i64 {
        let from = s.find(name).unwrap() + name.len();
        s[from..from + s[from..].find('"').unwrap()]
            .parse()
            .unwrap()
    };
    fig.split("<rect ")
        .skip(1)
        .map(|r| (attr(r, "data-start-ms=\""), attr(r, "data-count=\"")))
        .collect()
}

/// The `(data-bucket-ms)` of the figure of `class`.
fn bucket_ms(body: &str, class: &str) -> i64 {
    let open = format!("<figure class=\"chart {class}\">");
    let fig = &body[body.find(&open).unwrap()..];
    let from = fig.find("data-bucket-ms=\"").unwrap() + 16;
    fig[from..from + fig[from..].find('"').unwrap()]
        .parse()
        .unwrap()
}

/// A campaign over `n` recipients whose ledger says: recipient `i` got
/// `state` at `at(i)`; the counters' span is `first ..= last`.
fn ledger(env: &Env, name: &str, n: usize, rows: &[(usize, &str, i64)], span: (i64, i64)) -> i64 {
    env.campaign_without_enqueue(name, n);
    let id = env.status(name)["id"].as_i64().unwrap();
    let ids = member_ids(env, name);
    let mut sql = String::new();
    for (i, state, at) in rows {
        sql.push_str(&format!(
            "INSERT INTO deliveries (campaign_id, recipient_id, state, attempts, updated_at) \
             VALUES ({id}, {}, '{state}', 1, {at});\n",
            ids[*i]
        ));
    }
    let sent = rows.iter().filter(|r| r.1 == "sent").count();
    let failed = rows.iter().filter(|r| r.1 == "failed").count();
    sql.push_str(&format!(
        "UPDATE campaign_counters SET recipients = {n}, sent = {sent}, failed = {failed}, \
         first_at = {}, last_at = {} WHERE campaign_id = {id};",
        span.0, span.1
    ));
    env.sql(&sql);
    id
}

fn charts_over_http(kind: Kind) {
    let env = Env::new(kind, "127.0.0.1:1");
    env.ok(&["migrate"]);
    // Minutes 0, 0, 2, 3 sent; minute 2 failed; one row stamped a minute
    // before the counters' first outcome (a worker's clock behind) and a
    // `retry` row that is no outcome at all.
    let rows = [
        (0, "sent", T0 + 1_000),
        (1, "sent", T0 + 59_999),
        (2, "sent", T0 + 2 * MINUTE + 5),
        (3, "failed", T0 + 2 * MINUTE + 30_000),
        (4, "sent", T0 + 3 * MINUTE),
        (5, "sent", T0 - MINUTE),
        (6, "retry", T0 + MINUTE),
    ];
    let id = ledger(&env, "short", 10, &rows, (T0 + 1_000, T0 + 3 * MINUTE));
    // Five hours: five-minute buckets, 61 of them at most.
    let long_rows: Vec<(usize, &str, i64)> = (0..10)
        .map(|i| (i, "sent", T0 + i as i64 * 30 * MINUTE))
        .collect();
    let long = ledger(&env, "long", 10, &long_rows, (T0, T0 + 300 * MINUTE));
    env.campaign_without_enqueue("fresh", 3);
    let fresh = env.status("fresh")["id"].as_i64().unwrap();
    let served = env.serve(Some(TOKEN));

    let page = get(served.admin, &format!("/campaigns/{id}"));
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;
    assert_eq!(bucket_ms(body, "sent"), MINUTE);
    assert_eq!(
        bars(body, "sent"),
        [(T0, 3), (T0 + 2 * MINUTE, 1), (T0 + 3 * MINUTE, 1)],
        "the stray row counts in the first minute"
    );
    assert_eq!(bars(body, "failed"), [(T0 + 2 * MINUTE, 1)]);
    let sent: i64 = bars(body, "sent").iter().map(|b| b.1).sum();
    assert_eq!(sent, env.status("short")["sent"].as_i64().unwrap());
    // The text alternative: caption, label, table with every minute.
    assert!(
        body.contains("<figcaption>Sent per minute (UTC)</figcaption>"),
        "{body}"
    );
    assert!(body.contains("role=\"img\" aria-label=\"Sent per minute from 11:20 to 11:24 UTC: 5 in all, at most 3 (from 11:20).\""), "{body}");
    assert!(
        body.contains(
            "<time datetime=\"2025-11-26T11:22:00Z\">11:22</time></td><td class=\"num\">1</td>"
        ),
        "{body}"
    );
    assert!(body.contains("Failed per minute (UTC)"), "{body}");
    assert!(!body.to_ascii_lowercase().contains("<script"), "{body}");
    // The progress bar: 6 of 10 with an outcome (5 sent, 1 failed).
    assert!(body.contains("role=\"progressbar\""), "{body}");
    assert!(body.contains("aria-valuenow=\"60.0\""), "{body}");

    let page = get(served.admin, &format!("/campaigns/{long}"));
    assert_eq!(bucket_ms(&page.body, "sent"), 5 * MINUTE);
    let b = bars(&page.body, "sent");
    assert_eq!(b.len(), 10, "{b:?}");
    assert_eq!(b.iter().map(|b| b.1).sum::<i64>(), 10);
    assert_eq!(b[9], (T0 + 270 * MINUTE, 1));
    assert!(page.body.matches("<tr><td><time").count() <= 2 * 120);
    assert!(page.body.contains("Sent per 5 minutes (UTC)"));

    // Nothing sent yet: that sentence, no empty charts.
    let page = get(served.admin, &format!("/campaigns/{fresh}"));
    assert!(
        !page.body.contains("<figure class=\"chart"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("<p class=\"empty no-sends\">No sends yet.</p>"),
        "{}",
        page.body
    );

    // The dashboard's live part: a progress bar per campaign with values.
    let live = get(served.admin, "/live");
    assert_eq!(live.status, 200);
    assert_eq!(
        live.body.matches("role=\"progressbar\"").count(),
        3,
        "{}",
        live.body
    );
    assert!(live.body.contains("aria-label=\"short: recipients with an outcome\" aria-valuenow=\"60.0\" aria-valuemin=\"0\" aria-valuemax=\"100\""), "{}", live.body);
}

both!(charts_over_http);

/// The ledger's sent or failed per minute, counted by this test.
fn per_minute(env: &Env, campaign: i64, state: &str) -> BTreeMap<i64, i64> {
    use diesel::sql_types::BigInt;
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        at: i64,
    }
    let path = env.db.url.strip_prefix("sqlite://").unwrap();
    let rows: Vec<Row> = diesel::sql_query(format!(
        "SELECT updated_at AS at FROM deliveries WHERE campaign_id = {campaign} AND state = '{state}'"
    ))
    .load(&mut diesel::SqliteConnection::establish(path).unwrap())
    .unwrap();
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry(r.at - r.at.rem_euclid(MINUTE)).or_insert(0) += 1;
    }
    out
}

fn pct(status: &Value) -> String {
    let n = |k: &str| status[k].as_i64().unwrap();
    let done = (n("sent") + n("failed") + n("skipped")) as f64 * 100.0 / n("recipients") as f64;
    format!("{done:.1}")
}

/// A real send (every 9th address refused), then the page in chromium:
/// the bars are there, per minute as the ledger says, summing to `sent`
/// and `failed`; each chart has its caption and table; the progress bars
/// say what `status --json` says.
#[test]
fn charts_in_chromium_match_the_ledger() {
    let (tmp, _bs, peer, env) = setup(
        Kind::Sqlite,
        Script {
            reject_every: Some(9),
            data_delay: Duration::from_millis(20),
            ..Script::default()
        },
    );
    env.campaign("autumn", 120);
    let _worker = env.worker(&["--concurrency", "2"]);
    wait_done(&env, "autumn", 120);
    let status = env.status("autumn");
    let id = status["id"].as_i64().unwrap();
    let (sent, failed) = (
        status["sent"].as_i64().unwrap(),
        status["failed"].as_i64().unwrap(),
    );
    assert!(sent > 0 && failed > 0, "{status}");
    assert_eq!(peer.total() as i64, sent);
    let served = env.serve(Some(TOKEN));
    let (_driver, driver_port) = chromedriver();
    let base = format!("http://127.0.0.1:{}", served.admin);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = browser(driver_port, &tmp.path().join("profile")).await;
        c.goto(&format!("{base}/")).await.unwrap();
        log_in(&c, TOKEN).await;
        let bar = c
            .wait()
            .for_element(Locator::Css(
                "tr[data-campaign='autumn'] [role=progressbar]",
            ))
            .await
            .unwrap();
        assert_eq!(bar.attr("aria-valuenow").await.unwrap(), Some(pct(&status)));
        assert_eq!(
            bar.attr("aria-valuemax").await.unwrap().as_deref(),
            Some("100")
        );

        c.goto(&format!("{base}/campaigns/{id}")).await.unwrap();
        c.wait()
            .for_element(Locator::Css("figure.chart.sent svg"))
            .await
            .unwrap();
        for (class, state, total) in [("sent", "sent", sent), ("failed", "failed", failed)] {
            let drawn = c
                .execute(
                    "const f = document.querySelector('figure.chart.' + arguments[0]); \
                     return { bars: [...f.querySelectorAll('svg rect.bar')].map(r => \
                       [Number(r.dataset.startMs), Number(r.dataset.count), r.getBBox().height]), \
                       role: f.querySelector('svg').getAttribute('role'), \
                       label: f.querySelector('svg').getAttribute('aria-label'), \
                       caption: f.querySelector('figcaption').textContent, \
                       rows: f.querySelectorAll('details table tbody tr').length }",
                    vec![json!(class)],
                )
                .await
                .unwrap();
            let bars = drawn["bars"].as_array().unwrap();
            let mut seen = BTreeMap::new();
            for b in bars {
                assert!(b[2].as_f64().unwrap() > 0.0, "a bar with no height: {b}");
                seen.insert(b[0].as_i64().unwrap(), b[1].as_i64().unwrap());
            }
            assert_eq!(seen, per_minute(&env, id, state), "{class}: {drawn}");
            assert_eq!(seen.values().sum::<i64>(), total, "{class}");
            assert_eq!(drawn["role"], "img");
            assert!(
                drawn["label"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("{total} in all")),
                "{drawn}"
            );
            assert!(
                drawn["caption"].as_str().unwrap().contains("per minute"),
                "{drawn}"
            );
            assert!(drawn["rows"].as_i64().unwrap() >= 1, "{drawn}");
        }
        let bar = c.find(Locator::Css("[role=progressbar]")).await.unwrap();
        assert_eq!(bar.attr("aria-valuenow").await.unwrap(), Some(pct(&status)));
        assert_eq!(
            bar.attr("aria-valuemin").await.unwrap().as_deref(),
            Some("0")
        );
        assert!(bar.attr("aria-label").await.unwrap().is_some());
        screenshot(&c, "campaign-charts.png").await;
        c.close().await.unwrap();
    });
}
