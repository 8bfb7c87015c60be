//! The DKIM keys and message templates pages over real HTTP, on both
//! databases: each form does what its CLI command does (checked with the
//! CLI), a refusal is the stage's own sentence with what was typed kept
//! (422), a private key is never on a page, and no POST works without the
//! session's CSRF token.

use crate::admin::TOKEN;
use crate::manage::{refuse_forged_posts, secret_of, Browser};
use crate::util::*;

/// `dkim list`'s line for `domain`'s key `selector`: its algorithm and
/// state, or `None`.
fn listed(env: &Env, domain: &str, selector: &str) -> Option<String> {
    let head = format!("{domain}  selector {selector}  ");
    env.ok(&["dkim", "list"])
        .lines()
        .find(|l| l.starts_with(&head))
        .map(|l| l[head.len()..].to_string())
}

fn dkim_keys_are_made_rotated_activated_and_deleted(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    assert!(b.get("/dkim").body.contains("No DKIM keys yet"));

    let made = b.post("/dkim", &[("domain", "Shop.Test"), ("algorithm", "rsa")]);
    assert_eq!(made.status, 200, "{}", made.body);
    assert!(
        made.body.contains("mailsplit._domainkey.shop.test"),
        "{}",
        made.body
    );
    let value = secret_of(&made.body);
    assert!(value.starts_with("v=DKIM1; k=rsa; p="), "{value}");
    // The record shown is the one `dkim list` prints.
    assert!(env.ok(&["dkim", "list"]).contains(&value));
    assert_eq!(
        listed(&env, "shop.test", "mailsplit").unwrap(),
        "rsa  active (signs)"
    );
    // The private key is on no page.
    let private = mailsplit::dkim::keys(&mut env.conn()).unwrap()[0]
        .private_key()
        .to_string();
    for page in [&made.body, &b.get("/dkim").body] {
        assert!(!page.contains(&private[..40]), "a private key on a page");
    }

    // The stage's refusals, with what was typed kept.
    let twice = b.post(
        "/dkim",
        &[("domain", "shop.test"), ("selector", "mailsplit")],
    );
    assert_eq!(twice.status, 422, "{}", twice.body);
    assert!(twice.body.contains("mailsplit"), "{}", twice.body);
    let bad = b.post("/dkim", &[("domain", "not a domain")]);
    assert_eq!(bad.status, 422, "{}", bad.body);
    assert!(bad.body.contains("bad domain"), "{}", bad.body);
    assert!(bad.body.contains("value=\"not a domain\""));
    let algorithm = b.post("/dkim", &[("domain", "x.test"), ("algorithm", "dsa")]);
    assert_eq!(algorithm.status, 422, "{}", algorithm.body);
    assert!(listed(&env, "x.test", "mailsplit").is_none());
    let none = b.post("/dkim/rotate", &[("domain", "other.test")]);
    assert_eq!(none.status, 422);
    assert!(
        none.body.contains("has no active DKIM key"),
        "{}",
        none.body
    );

    // Rotate: a pending key beside the active one, which keeps signing.
    let rotated = b.post(
        "/dkim/rotate",
        &[("domain", "shop.test"), ("selector", "s2")],
    );
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    assert!(rotated
        .body
        .contains("still signed with selector mailsplit"));
    assert!(listed(&env, "shop.test", "s2")
        .unwrap()
        .starts_with("rsa  pending"));
    assert_eq!(
        listed(&env, "shop.test", "mailsplit").unwrap(),
        "rsa  active (signs)"
    );

    let activated = b.post("/dkim/shop.test/s2/activate", &[]);
    assert_eq!(activated.status, 303, "{}", activated.body);
    assert_eq!(
        listed(&env, "shop.test", "s2").unwrap(),
        "rsa  active (signs)"
    );
    assert_eq!(
        listed(&env, "shop.test", "mailsplit").unwrap(),
        "rsa  retired"
    );
    let unknown = b.post("/dkim/shop.test/nope/activate", &[]);
    assert_eq!(unknown.status, 422);
    assert!(unknown.body.contains("no DKIM key with selector nope"));

    let deleted = b.post("/dkim/shop.test/mailsplit/delete", &[]);
    assert_eq!(deleted.status, 303, "{}", deleted.body);
    assert!(listed(&env, "shop.test", "mailsplit").is_none());
    assert!(
        listed(&env, "shop.test", "s2").is_some(),
        "only that key went"
    );

    refuse_forged_posts(
        &b,
        &[
            ("/dkim", "domain=forged.test"),
            ("/dkim/rotate", "domain=shop.test&selector=forged"),
            ("/dkim/shop.test/s2/delete", ""),
        ],
    );
    assert!(listed(&env, "forged.test", "mailsplit").is_none());
    assert!(listed(&env, "shop.test", "forged").is_none());
    assert!(listed(&env, "shop.test", "s2").is_some());
}

/// `template ls --json`'s object for `name`.
fn template(env: &Env, name: &str) -> Option<serde_json::Value> {
    env.ok(&["template", "ls", "--json"])
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|t| t["name"] == name)
}

fn templates_are_created_edited_and_removed(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    assert!(b
        .get("/templates")
        .body
        .contains("No message templates yet"));
    let markdown = "# Thanks {{ name }}\n\nOrder **{{ data.order }}** <script>x</script>";
    let made = b.post(
        "/templates",
        &[
            ("name", "order"),
            ("subject", "Order {{ data.order }}"),
            ("from", "Shop <orders@shop.test>"),
            ("stream", "transactional"),
            ("format", "markdown"),
            ("content", markdown),
        ],
    );
    assert_eq!(made.status, 303, "{}", made.body);
    assert_eq!(made.header("location"), Some("/templates/order"));
    let t = template(&env, "order").expect("created as `template create` would");
    assert_eq!(
        (&t["stream"], &t["version"], &t["subject"]),
        (
            &"transactional".into(),
            &1.into(),
            &"Order {{ data.order }}".into()
        ),
        "{t}"
    );
    let page = b.get("/templates/order");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Version 1"));
    // The source is shown as text: the converted HTML, escaped.
    assert!(page.body.contains("&#60;h1&#62;Thanks"), "{}", page.body);
    assert!(
        !page.body.contains("<script>x"),
        "template source rendered into the page"
    );
    assert!(b.get("/templates").body.contains("data-template=\"order\""));

    // A template that does not compile: the stage's sentence, what was typed kept.
    let bad = b.post(
        "/templates",
        &[
            ("name", "broken"),
            ("subject", "Hi"),
            ("from", "shop@shop.test"),
            ("format", "html"),
            ("content", "<p>{{ data.order </p>"),
        ],
    );
    assert_eq!(bad.status, 422, "{}", bad.body);
    assert!(bad.body.contains("value=\"broken\""));
    assert!(
        bad.body.contains("{{ data.order &#60;/p&#62;"),
        "{}",
        bad.body
    );
    assert!(template(&env, "broken").is_none());
    let twice = b.post(
        "/templates",
        &[
            ("name", "order"),
            ("subject", "x"),
            ("from", "a@b.test"),
            ("content", "<p>x</p>"),
        ],
    );
    assert_eq!(twice.status, 422);
    assert!(twice.body.contains("already exists"), "{}", twice.body);

    // Edit: a new version; empty fields keep what is stored.
    let edited = b.post(
        "/templates/order",
        &[
            ("subject", "Your order {{ data.order }}"),
            ("stream", "marketing"),
        ],
    );
    assert_eq!(edited.status, 200, "{}", edited.body);
    assert!(edited.body.contains("Version 2 stored"));
    let t = template(&env, "order").unwrap();
    assert_eq!(
        (&t["stream"], &t["version"], &t["subject"], &t["from"]),
        (
            &"marketing".into(),
            &2.into(),
            &"Your order {{ data.order }}".into(),
            &"Shop <orders@shop.test>".into()
        ),
        "{t}"
    );
    let refused = b.post("/templates/order", &[("from", "not an address")]);
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.body.contains("value=\"not an address\""));
    assert_eq!(template(&env, "order").unwrap()["version"], 2);
    assert_eq!(b.get("/templates/nosuch").status, 404);

    refuse_forged_posts(
        &b,
        &[
            (
                "/templates",
                "name=forged&subject=x&from=a%40b.test&content=x",
            ),
            ("/templates/order", "subject=forged"),
            ("/templates/order/remove", ""),
        ],
    );
    assert!(template(&env, "forged").is_none());
    assert_eq!(template(&env, "order").unwrap()["version"], 2);

    let removed = b.post("/templates/order/remove", &[]);
    assert_eq!(removed.status, 303, "{}", removed.body);
    assert!(template(&env, "order").is_none());
}

/// `list ls`'s line for `list`, its columns split.
fn list_line(env: &Env, list: &str) -> Option<Vec<String>> {
    env.ok(&["list", "ls"])
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .find(|cols| cols.first().map(String::as_str) == Some(list))
}

fn lists_are_created_changed_and_deleted(kind: Kind) {
    let (_tmp, _bs, env) = env_with_beanstalkd(kind);
    env.ok(&["migrate"]);
    env.import_n("news", 3);
    let s = env.serve(Some(TOKEN));
    let b = Browser::new(s.admin);
    let page = b.get("/lists");
    assert!(page.body.contains("data-list=\"news\""), "{}", page.body);
    assert!(
        page.body.contains("<td class=\"num\">3</td>"),
        "{}",
        page.body
    );

    let made = b.post(
        "/lists",
        &[
            ("name", "vip"),
            ("title", "VIP offers"),
            ("public", "public"),
            ("opt_in", "single"),
        ],
    );
    assert_eq!(made.status, 200, "{}", made.body);
    assert!(made.body.contains("List vip created."));
    // As `list create vip --title … --public --single-opt-in` makes it.
    let vip = list_line(&env, "vip").expect("listed by `list ls`");
    assert_eq!(vip[1..5], ["0", "0", "public", "single"], "{vip:?}");
    assert!(env.ok(&["list", "ls"]).contains("VIP offers"));

    let twice = b.post("/lists", &[("name", "vip")]);
    assert_eq!(twice.status, 422, "{}", twice.body);
    assert!(twice.body.contains("already exists"), "{}", twice.body);
    let bad = b.post("/lists", &[("name", "two words")]);
    assert_eq!(bad.status, 422);
    assert!(bad.body.contains("bad list name"), "{}", bad.body);
    assert!(
        bad.body.contains("value=\"two words\""),
        "what was typed is kept"
    );

    // Change: only what was chosen; "keep" keeps.
    let changed = b.post("/lists/set", &[("name", "vip"), ("public", "private")]);
    assert_eq!(changed.status, 200, "{}", changed.body);
    let vip = list_line(&env, "vip").unwrap();
    assert_eq!(vip[3..5], ["private", "single"], "{vip:?}");
    assert!(
        env.ok(&["list", "ls"]).contains("VIP offers"),
        "the title kept"
    );
    let nothing = b.post("/lists/set", &[("name", "vip")]);
    assert_eq!(nothing.status, 422);
    assert!(
        nothing.body.contains("nothing to change"),
        "{}",
        nothing.body
    );

    // Delete: refused while a campaign of the list may send.
    env.create_campaign("spring", "news", &[]);
    env.ok(&["enqueue", "spring"]);
    let in_use = b.post("/lists/news/delete", &[]);
    assert_eq!(in_use.status, 422, "{}", in_use.body);
    assert!(in_use.body.contains("is in use"), "{}", in_use.body);
    assert_eq!(list_line(&env, "news").unwrap()[1], "3");
    let gone = b.post("/lists/vip/delete", &[]);
    assert_eq!(gone.status, 200, "{}", gone.body);
    assert!(gone.body.contains("List vip deleted"), "{}", gone.body);
    assert!(list_line(&env, "vip").is_none());

    refuse_forged_posts(
        &b,
        &[
            ("/lists", "name=forged"),
            ("/lists/set", "name=news&public=public"),
            ("/lists/news/delete", ""),
        ],
    );
    assert!(list_line(&env, "forged").is_none());
    assert_eq!(
        list_line(&env, "news").unwrap()[1..4],
        ["3", "3", "private"]
    );
}

both!(
    lists_are_created_changed_and_deleted,
    dkim_keys_are_made_rotated_activated_and_deleted,
    templates_are_created_edited_and_removed,
);
