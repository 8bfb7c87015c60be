//! A transactional message's bounce finds it: with `--return-path` each
//! message goes out from `local+TOKEN@domain`, TOKEN naming the message;
//! a DSN or complaint sent there later marks the message `bounced` and
//! keeps the address from further mail (a stranger is suppressed, a
//! recipient on file changed as a campaign's report would change them).

use std::io::Write;
use std::process::Stdio;

use mailsplit::store::messages::MessageStatus;
use mailsplit::store::RecipientStatus;

use super::{send, status, templates, wait_status};
use crate::util::*;

/// `mailsplit bounce [envelope]` with `message` on stdin; its log.
fn bounce(env: &Env, envelope: &[&str], message: &str) -> String {
    let mut args = vec!["bounce"];
    args.extend_from_slice(envelope);
    let mut child = env
        .cmd(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(message.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stderr(&out)
}

/// An abuse report whose Original-Mail-From is `sender`.
fn complaint(sender: &str, rcpt: &str) -> String {
    format!(
        "From: feedback@arf.mail.example\r\nTo: fbl@example.test\r\nSubject: complaint\r\n\
MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=feedback-report; boundary=\"b\"\r\n\r\n\
--b\r\nContent-Type: text/plain\r\n\r\nThis is an abuse report.\r\n\
--b\r\nContent-Type: message/feedback-report\r\n\r\nFeedback-Type: abuse\r\nUser-Agent: test/1.0\r\nVersion: 1\r\n\
Original-Mail-From: <{sender}>\r\nOriginal-Rcpt-To: <{rcpt}>\r\n\r\n\
--b\r\nContent-Type: message/rfc822\r\n\r\nFrom: shop@example.test\r\nTo: {rcpt}\r\nSubject: Order\r\n\r\nhi\r\n--b--\r\n"
    )
}

fn a_bounce_marks_its_message_and_stops_the_next(kind: Kind) {
    let (_tmp, _bs, peer, env) = setup(kind, Script::default());
    templates(&env);
    let csv = env.dir.path().join("people.csv");
    std::fs::write(&csv, "email,city\nbob@example.test,Oslo\n").unwrap();
    env.ok(&["import", csv.to_str().unwrap(), "--list", "news"]);
    // Upper case in, canonical out; `edit` sets it on an existing template.
    let rp = "Bounces@Bounce.Example.test";
    env.ok(&["template", "edit", "order", "--return-path", rp]);
    env.ok(&["template", "edit", "promo", "--return-path", rp]);
    let out = env.run(&["template", "edit", "order", "--return-path", "a+b@x.test"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let _w = env.worker(&[]);
    let (ada, _) = send(&env, "order", "Ada <ada@example.org>", &[]);
    let (bob, _) = send(&env, "order", "bob@example.test", &[]);
    wait_status(&env, ada, MessageStatus::Sent, 30);
    wait_status(&env, bob, MessageStatus::Sent, 30);

    // Each went out from its own VERP address naming that message, and
    // the token is no campaign's.
    let senders = peer.senders.lock().unwrap().clone();
    let identity = env.identity();
    let token_of = |rcpt: &str| -> String {
        let sender = &senders[rcpt];
        let (local, domain) = sender.split_once('@').unwrap();
        assert_eq!(domain, "bounce.example.test", "{sender}");
        local.strip_prefix("Bounces+").unwrap().to_string()
    };
    assert_eq!(
        identity
            .signer
            .read_message_verp(&token_of("ada@example.org")),
        Some(ada)
    );
    assert_eq!(
        identity
            .signer
            .read_message_verp(&token_of("bob@example.test")),
        Some(bob)
    );
    assert_eq!(
        identity.signer.read_verp(&token_of("ada@example.org")),
        None
    );

    // A hard bounce of Ada's message, delivered to its VERP address (lower
    // case, as Postfix hands it on): bounced, and Ada, on no list, is
    // suppressed; the next message to her is not sent.
    let verp_ada = senders["ada@example.org"].to_lowercase();
    let dsn = postfix_dsn(
        &verp_ada,
        "ada@example.org",
        "5.1.1",
        "550 5.1.1 <ada@example.org>: Recipient address rejected: User unknown",
        "<x@example.test>",
    );
    let log = bounce(&env, &[&verp_ada], &dsn);
    assert!(log.contains("message_now=\"bounced\""), "{log}");
    let view = status(&env, ada);
    assert_eq!(view.status, MessageStatus::Bounced);
    assert!(view.reply.unwrap_or_default().contains("5.1.1"));
    let listed = env.ok(&["suppress", "ls"]);
    assert!(listed.contains("ada@example.org"), "{listed}");
    // The same report again changes nothing more.
    let again = bounce(&env, &[&verp_ada], &dsn);
    assert!(again.contains("message_now=\"unchanged\""), "{again}");
    // Refused at submit now that she is on the suppression list.
    let out = env.run(&["send", "order", "--to", "ada@example.org", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("suppression list"),
        "{}",
        stderr(&out)
    );

    // A complaint about Bob's message: it arrived (still `sent`), and Bob,
    // a recipient on file, is unsubscribed as by a campaign's complaint;
    // no more messages of either stream go to him.
    let verp_bob = senders["bob@example.test"].clone();
    bounce(&env, &[], &complaint(&verp_bob, "bob@example.test"));
    assert_eq!(status(&env, bob).status, MessageStatus::Sent);
    let (now, _) = mailsplit::store::bounces::status_of(
        &mut env.conn(),
        mailsplit::store::bounces::find_recipient(&mut env.conn(), "bob@example.test")
            .unwrap()
            .unwrap()
            .0,
    )
    .unwrap()
    .unwrap();
    assert_eq!(now, RecipientStatus::Unsubscribed);
    let (order, _) = send(&env, "order", "bob@example.test", &[]);
    let (promo, _) = send(&env, "promo", "bob@example.test", &[]);
    wait_status(&env, order, MessageStatus::Suppressed, 30);
    wait_status(&env, promo, MessageStatus::Suppressed, 30);
    // Bob complained, he did not bounce: not on the suppression list.
    assert!(!env.ok(&["suppress", "ls"]).contains("bob@example.test"));
    // Nothing more reached the peer: a later message to Ada or Bob would
    // have come from a VERP address of its own.
    assert_eq!(*peer.senders.lock().unwrap(), senders);
}

both!(a_bounce_marks_its_message_and_stops_the_next);
