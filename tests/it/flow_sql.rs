//! Flows started by a query on the shop's database (issue 39, the SQL
//! trigger). An abandoned-cart table in a PostgreSQL database of the
//! test's own, against the real binary, beanstalkd and the scripted SMTP
//! peer, with SQLite and PostgreSQL as mailsplit's database: a cart bought
//! before its reminder is due leaves (`no longer matched`) and gets no
//! mail; the other gets its reminder with the row's total; a second cart
//! of the same address enters on its own; an address that unsubscribed
//! gets nothing; the lease holder killed with -9 mid-way changes nothing
//! (each reminder exactly once, counted at the peer).

use diesel::connection::SimpleConnection;
use diesel::Connection;

use crate::util::*;

/// Run `sql` on the shop's database at `url`.
fn shop(url: &str, sql: &str) {
    diesel::pg::PgConnection::establish(url)
        .unwrap()
        .batch_execute(sql)
        .unwrap();
}

/// The messages the peer took for `addr`, subject and parts decoded.
fn mails(peer: &ScriptedSmtp, addr: &str) -> Vec<Parts> {
    peer.messages
        .lock()
        .unwrap()
        .iter()
        .filter(|(rcpts, _)| rcpts.iter().any(|r| r == addr))
        .map(|(_, text)| parts(text))
        .collect()
}

/// The pid in the scheduler lease's owner (`host:pid:random`), if held.
fn lease_pid(env: &Env) -> Option<u32> {
    let mut c = env.conn();
    let (owner, _) = mailsplit::store::flows::holder(&mut c).unwrap()?;
    owner?.split(':').nth(1)?.parse().ok()
}

fn report(env: &Env) -> serde_json::Value {
    serde_json::from_str(env.ok(&["flow", "report", "cart", "--json"]).trim()).unwrap()
}

const QUERY: &str =
    "SELECT email, cart_id AS key, cart_id, total FROM carts WHERE state = 'abandoned'";

fn abandoned_cart(kind: Kind) {
    let env = World::with_peer(
        kind,
        Script {
            keep_data: true,
            ..Script::default()
        },
    )
    .var("MAILSPLIT_LEASE_MS", "3000")
    .var("MAILSPLIT_FLOW_TICK_MS", "200");
    let peer = env.peer();
    env.ok(&["migrate"]);
    let html = env.dir.path().join("cart.html");
    std::fs::write(
        &html,
        "<p>Cart {{ row.cart_id }} of {{ name | default(\"you\") }}: {{ row.total }} EUR</p>\n",
    )
    .unwrap();
    env.ok(&[
        "template",
        "create",
        "cart",
        "--subject",
        "Your cart {{ row.key }}",
        "--from",
        "shop@example.test",
        "--html",
        html.to_str().unwrap(),
        "--stream",
        "marketing",
    ]);
    // carol unsubscribed long ago: her cart must not bring her back.
    let csv = env.dir.path().join("carol.csv");
    std::fs::write(&csv, "email,name\ncarol@shop.test,Carol\n").unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "news"]);
    env.sql("UPDATE recipients SET status = 'unsubscribed' WHERE email = 'carol@shop.test'");

    let db = TestDb::empty(Kind::Postgres);
    shop(
        &db.url,
        "CREATE TABLE carts (email TEXT, cart_id INTEGER, total NUMERIC, state TEXT); \
         INSERT INTO carts VALUES ('ann@shop.test', 1, 19.90, 'abandoned'), \
         ('bob@shop.test', 2, 42.00, 'abandoned'), ('carol@shop.test', 4, 7.00, 'abandoned')",
    );
    let create = |query: &str, extra: &[&str]| {
        let mut args = vec![
            "flow",
            "create",
            "cart",
            "--trigger-sql",
            query,
            "--source",
            &db.url,
            "--every",
            "1s",
            "--step",
            "4s:cart",
        ];
        args.extend_from_slice(extra);
        env.run(&args)
    };
    // Refused before anything is stored, each naming the fix: a user who
    // can write (the test's superuser), a query without `key`.
    let out = create(QUERY, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--allow-privileged-source"),
        "{}",
        stderr(&out)
    );
    let out = create(
        "SELECT email, total FROM carts",
        &["--allow-privileged-source"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("must return the columns `email` and `key`"),
        "{}",
        stderr(&out)
    );
    let out = create(QUERY, &["--allow-privileged-source"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let mut a = env.worker(&[]);
    let mut b = env.worker(&[]);
    wait_for(30, "the three carts to enter", || {
        report(&env)["entered"] == 3
    });
    // Bob buys before his reminder is due.
    shop(
        &db.url,
        "UPDATE carts SET state = 'bought' WHERE cart_id = 2",
    );
    wait_for(30, "ann's first reminder", || {
        mails(peer, "ann@shop.test").len() == 1
    });
    // Ann leaves a second cart; the lease holder dies with -9.
    shop(
        &db.url,
        "INSERT INTO carts VALUES ('ann@shop.test', 3, 5.50, 'abandoned')",
    );
    let holder = lease_pid(&env).unwrap();
    let (dead, survivor) = if a.0.id() == holder {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    signal(&dead.0, "KILL");
    wait_exit(&mut dead.0, 10);
    wait_for(40, "ann's second reminder", || {
        mails(peer, "ann@shop.test").len() >= 2
    });
    wait_for(20, "every entry done or left", || {
        let r = report(&env);
        r["done"] == 2 && r["active"] == 0
    });
    let survivor_pid = survivor.0.id();
    let survivor = if a.0.id() == survivor_pid { a } else { b };
    stop_worker(survivor);

    let ann = mails(peer, "ann@shop.test");
    let mut subjects: Vec<&str> = ann.iter().map(|p| p.subject.as_str()).collect();
    subjects.sort();
    assert_eq!(subjects, vec!["Your cart 1", "Your cart 3"]);
    let body = |cart: &str| &ann.iter().find(|p| p.subject.ends_with(cart)).unwrap().html;
    assert!(
        body("1").contains("Cart 1 of you: 19.90 EUR"),
        "{}",
        body("1")
    );
    assert!(
        body("3").contains("Cart 3 of you: 5.50 EUR"),
        "{}",
        body("3")
    );
    assert!(mails(peer, "bob@shop.test").is_empty(), "bob bought");
    assert!(
        mails(peer, "carol@shop.test").is_empty(),
        "carol unsubscribed"
    );
    assert_eq!(peer.total(), 2, "nothing else, nothing twice");

    let r = report(&env);
    assert_eq!(r["entered"], 4, "{r}");
    // One message per reminder. A worker killed between handing a message
    // to the relay and recording the reply leaves it `failed` (in doubt,
    // never sent twice): the peer above counted each exactly once.
    let step = &r["steps"][0];
    assert_eq!(step["queued"], 2, "{r}");
    assert_eq!(
        step["sent"].as_i64().unwrap() + step["failed"].as_i64().unwrap(),
        2,
        "{r}"
    );
    assert_eq!(r["left"]["no longer matched"], 1, "{r}");
    assert_eq!(r["left"]["unsubscribed"], 1, "{r}");
    // The rows' addresses became recipients; carol stayed unsubscribed.
    let status = |email: &str| {
        let out = env.ok(&["subscriber", "export", email]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["recipient"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(status("bob@shop.test"), "active");
    assert_eq!(status("carol@shop.test"), "unsubscribed");
    // Carol left before her first step: no step's unsubscribe.
    assert_eq!(r["steps"][0]["unsubscribed"], 0, "{r}");
    assert!(r["steps"][0]["opened"].is_null(), "{r}");
    flow_pages(&env, step["sent"].as_i64().unwrap());
}

fn get(port: u16, path: &str, token: Option<&str>) -> Http {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    http("GET", port, path, &headers, None)
}

/// The dashboard's flow pages, as an admin: the list links the flow, its
/// page shows the figures `flow report` gives (`sent`: its count); nothing without the token.
fn flow_pages(env: &Env, sent: i64) {
    const TOKEN: &str = "flow-page-token";
    let served = env.serve(Some(TOKEN));
    assert_eq!(get(served.admin, "/flows", None).status, 401);
    assert_eq!(get(served.admin, "/flows/cart", Some("wrong")).status, 401);
    let home = get(served.admin, "/", Some(TOKEN));
    assert!(home.body.contains("href=\"/flows\""), "{}", home.body);
    let list = get(served.admin, "/flows", Some(TOKEN));
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(
        list.header("content-security-policy")
            .is_some_and(|p| p.contains("default-src 'none'")),
        "{:?}",
        list.headers
    );
    assert!(
        list.body.contains("<a href=\"/flows/cart\">cart</a>"),
        "{}",
        list.body
    );
    assert!(list.body.contains("<td>4s:cart</td>"), "{}", list.body);
    assert!(
        list.body.contains("<td class=\"num done\">2</td>"),
        "{}",
        list.body
    );
    let page = get(served.admin, "/flows/cart", Some(TOKEN));
    assert_eq!(page.status, 200, "{}", page.body);
    let sent = format!("<td class=\"num sent\">{sent}</td>");
    for fact in [
        "<dd class=\"entered\">4</dd>",
        "<td class=\"num queued\">2</td>",
        &sent,
        "<dd class=\"done\">2</dd>",
        "<dd class=\"left\">2</dd>",
        "<tr data-reason=\"no longer matched\"><td>no longer matched</td><td class=\"num\">1</td></tr>",
        "<tr data-reason=\"unsubscribed\"><td>unsubscribed</td><td class=\"num\">1</td></tr>",
    ] {
        assert!(page.body.contains(fact), "{fact} not in {}", page.body);
    }
    assert_eq!(get(served.admin, "/flows/nope", Some(TOKEN)).status, 404);
}

both!(abandoned_cart);
