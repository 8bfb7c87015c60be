//! Bounces the way they really arrive: a campaign goes through a private
//! Postfix instance to a peer that refuses some recipients with 5xx;
//! Postfix itself writes the DSNs to each message's VERP return path, and
//! its pipe(8) transport hands them to `mailsplit bounce`. Also: the
//! database away while Postfix pipes a bounce (exit 75, Postfix keeps it,
//! recorded once the database is back).

use std::collections::BTreeSet;

use crate::util::postfix::{share_sqlite, Options, Pipe, Postfix};
use crate::util::*;
use mailsplit::store::bounces;
use mailsplit::store::RecipientStatus;

/// A Postfix that relays example.test to `peer_port` and pipes mail for
/// bounce.test to `mailsplit bounce` against `database_url`.
fn postfix(peer_port: u16, database_url: &str) -> Postfix {
    Postfix::start(Options {
        transports: vec![
            (
                "example.test".into(),
                format!("smtp:[127.0.0.1]:{peer_port}"),
            ),
            ("bounce.test".into(), "mailsplit:".into()),
        ],
        pipes: vec![Pipe {
            name: "mailsplit".into(),
            user: "nobody".into(),
            flags: "Rq".into(),
            argv: format!("{BIN} --database-url {database_url} bounce ${{recipient}}"),
            recipient_limit: 1,
            max_processes: 10,
        }],
        ..Options::default()
    })
}

fn status_of(env: &Env, email: &str) -> RecipientStatus {
    let id = bounces::find_recipient(&mut env.conn(), email)
        .unwrap()
        .unwrap()
        .0;
    bounces::status_of(&mut env.conn(), id).unwrap().unwrap().0
}

fn bounces_come_back_through_postfix(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        reject_every: Some(4),
        ..Script::default()
    });
    let mut env = Env::new(kind, &bs.addr());
    env.import_n("news", 24);
    let refused: BTreeSet<String> = (1..=24)
        .map(|i| format!("user{i}@example.test"))
        .filter(|a| picked(a, REJECT, Some(4)))
        .collect();
    assert!(!refused.is_empty() && refused.len() < 24, "{refused:?}");
    if kind == Kind::Sqlite {
        share_sqlite(&env.db.url);
    }
    let pf = postfix(peer.port, &env.db.url);
    env.smtp = pf.smtp_url();
    env.create_campaign("first", "news", &["--return-path", "bounces@bounce.test"]);
    env.ok(&["enqueue", "first"]);
    {
        let _w = env.worker(&[]);
        wait_done(&env, "first", 60);
    }
    // Postfix accepted all of them; the peer refused some afterwards.
    assert_eq!(env.status("first")["sent"], 24);
    pf.wait_log(60, "delivered via mailsplit service", refused.len());
    wait_for(30, "the bounces to be recorded", || {
        env.status("first")["bounced"] == refused.len() as i64
    });
    for i in 1..=24 {
        let a = format!("user{i}@example.test");
        let want = if refused.contains(&a) {
            RecipientStatus::Bounced
        } else {
            RecipientStatus::Active
        };
        assert_eq!(status_of(&env, &a), want, "{a}\n{}", pf.log());
    }
    let events = bounces::recent(&mut env.conn(), 100).unwrap();
    assert_eq!(events.len(), refused.len(), "{events:?}");
    assert!(events.iter().all(|e| e.campaign_id == Some(1)
        && e.status.as_deref() == Some("5.1.1")
        && e.kind == bounces::BounceKind::Hard));

    // The next campaign to the same list skips them.
    env.create_campaign("second", "news", &[]);
    env.ok(&["enqueue", "second"]);
    {
        let _w = env.worker(&[]);
        wait_done(&env, "second", 60);
    }
    let s = env.status("second");
    assert_eq!(s["skipped"], refused.len() as i64, "{s}");
    assert_eq!(s["sent"], 24 - refused.len() as i64, "{s}");
    pf.wait_log(60, "status=sent (250 queued)", 2 * (24 - refused.len()));
    for a in &refused {
        assert_eq!(peer.tries.lock().unwrap()[a], 1, "{a} was tried again");
    }
}

#[test]
fn database_away_while_postfix_pipes_a_bounce() {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(Script {
        reject: Some("user2@".into()),
        ..Script::default()
    });
    let mut env = Env::new(Kind::Postgres, &bs.addr());
    env.import_n("news", 3);
    // The pipe reaches PostgreSQL through a proxy that the test cuts.
    let base = pg_base();
    let server = base.rsplit('@').next().unwrap().to_string();
    let mut proxy = TcpProxy::start(server.parse().unwrap());
    let via_proxy = env
        .db
        .url
        .replace(&server, &format!("127.0.0.1:{}", proxy.port));
    let pf = postfix(peer.port, &via_proxy);
    env.smtp = pf.smtp_url();
    env.create_campaign("news", "news", &["--return-path", "bounces@bounce.test"]);
    env.ok(&["enqueue", "news"]);
    proxy.stop();
    {
        let _w = env.worker(&[]);
        wait_done(&env, "news", 60);
    }
    // The pipe ran, could not reach the database, exited 75; Postfix keeps
    // the bounce and tries again.
    pf.wait_log(60, "relay=mailsplit", 1);
    pf.wait_log(30, "status=deferred", 1);
    let log = pf.log();
    assert!(log.contains("try again later"), "{log}");
    assert!(!log.contains("delivered via mailsplit"), "{log}");
    assert_eq!(
        status_of(&env, "user2@example.test"),
        RecipientStatus::Active
    );
    assert!(pf.queued() >= 1, "the bounce is still in Postfix's queue");
    // Several retries (the pipe run again, not a throttled destination's
    // "delivery temporarily suspended") fail the same way; nothing is lost
    // meanwhile. The first full run of this session waited 30 s for
    // Postfix's own second try, which never came.
    pf.wait_log_flushing(60, &["relay=mailsplit", "status=deferred"], 3);

    proxy.resume();
    pf.flush();
    pf.wait_log(60, "delivered via mailsplit service", 1);
    assert_eq!(
        status_of(&env, "user2@example.test"),
        RecipientStatus::Bounced
    );
    assert_eq!(bounces::recent(&mut env.conn(), 10).unwrap().len(), 1);
    assert_eq!(env.status("news")["bounced"], 1);
    wait_for(30, "Postfix's queue to empty", || pf.queued() == 0);
}

both!(bounces_come_back_through_postfix);
