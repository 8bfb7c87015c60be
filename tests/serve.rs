//! `mailsplit serve` over real HTTP: two listeners split by trust, the admin
//! token, graceful shutdown.

mod common;

use std::time::Duration;

use common::{free_port, signal, wait_exit, wait_port, Env, Kind, Proc};

/// A running `serve` with its two ports.
struct Serve {
    proc: Proc,
    public: u16,
    admin: u16,
}

fn serve(env: &Env, token: Option<&str>) -> Serve {
    let (public, admin) = (free_port(), free_port());
    let mut cmd = env.cmd(&[
        "serve",
        "--listen",
        &format!("127.0.0.1:{public}"),
        "--admin-listen",
        &format!("127.0.0.1:{admin}"),
    ]);
    cmd.env_remove("MAILSPLIT_ADMIN_TOKEN");
    if let Some(t) = token {
        cmd.env("MAILSPLIT_ADMIN_TOKEN", t);
    }
    let proc = Proc(cmd.spawn().unwrap());
    wait_port(public);
    wait_port(admin);
    Serve {
        proc,
        public,
        admin,
    }
}

fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req =
        ureq::get(&format!("http://127.0.0.1:{port}{path}")).timeout(Duration::from_secs(10));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

#[test]
fn admin_routes_need_the_token_and_public_ones_do_not() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.campaign_without_enqueue("news", 3);
    let mut s = serve(&env, Some("s3cret-token"));
    assert_eq!(get(s.public, "/healthz", None), (200, "ok\n".into()));
    // No token, a wrong one, one with a different length: refused.
    for token in [None, Some("wrong-token!"), Some("s3cret")] {
        let (code, body) = get(s.admin, "/api/campaigns", token);
        assert_eq!(code, 401, "{token:?}: {body}");
        assert!(!body.contains("news"));
    }
    let (code, body) = get(s.admin, "/api/campaigns", Some("s3cret-token"));
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list[0]["name"], "news");
    assert_eq!(list[0]["state"], "draft");
    assert_eq!(list[0]["recipients"], 3);
    // The admin routes are not on the public listener.
    assert_eq!(get(s.public, "/api/campaigns", Some("s3cret-token")).0, 404);
    signal(&s.proc.0, "TERM");
    assert!(wait_exit(&mut s.proc.0, 10).success());
}

#[test]
fn without_a_token_the_admin_listener_stays_on_loopback() {
    let env = Env::new(Kind::Sqlite, "127.0.0.1:1");
    env.ok(&["migrate"]);
    let out = env
        .cmd(&[
            "serve",
            "--admin-listen",
            &format!("0.0.0.0:{}", free_port()),
        ])
        .env_remove("MAILSPLIT_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains("MAILSPLIT_ADMIN_TOKEN"), "{err}");
}
