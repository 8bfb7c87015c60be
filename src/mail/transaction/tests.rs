//! The transaction against scripted relays: one flight per message, a
//! refused recipient or sender judged by the right reply.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::super::{Composed, Relay, Verdict};
use super::dot_stuffed;

#[test]
fn lines_starting_with_a_dot_get_a_second_one() {
    let cases: [(&[u8], &[u8]); 7] = [
        (b"", b"\r\n.\r\n"),
        (b".", b"..\r\n.\r\n"),
        (b"a\r\n.b\r\n", b"a\r\n..b\r\n\r\n.\r\n"),
        (b".\r\n.\r\n..", b"..\r\n..\r\n...\r\n.\r\n"),
        // Only CRLF ends a line: a bare LF or CR does not.
        (b"a\n.b\r.c", b"a\n.b\r.c\r\n.\r\n"),
        (b"a\r\r\n.b", b"a\r\r\n..b\r\n.\r\n"),
        (b"x.\r\ny .\r\n", b"x.\r\ny .\r\n\r\n.\r\n"),
    ];
    for (message, wire) in cases {
        assert_eq!(
            dot_stuffed(message),
            wire,
            "{:?}",
            String::from_utf8_lossy(message)
        );
    }
}
use crate::config::SmtpUrl;

fn message(to: &str) -> Composed {
    let from: lettre::Address = "news@example.test".parse().unwrap();
    let to: lettre::Address = to.parse().unwrap();
    Composed {
        envelope: lettre::address::Envelope::new(Some(from), vec![to]).unwrap(),
        bytes: b"Subject: hi\r\n\r\n.leading dot\r\nbye\r\n".to_vec(),
    }
}

/// Read lines up to and including one that starts with `until`
/// (answering nothing meanwhile).
async fn lines_until(io: &mut BufReader<TcpStream>, until: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let mut line = String::new();
        assert!(io.read_line(&mut line).await.unwrap() > 0, "closed early");
        let done = line.starts_with(until);
        got.push(line);
        if done {
            return got;
        }
    }
}

/// A relay offering PIPELINING that answers no command of a
/// transaction before its DATA has arrived: a client waiting for the
/// MAIL reply before sending RCPT would hang here. Per transaction it
/// answers with `replies` and returns the lines it read.
async fn strict_relay(
    listener: TcpListener,
    transactions: Vec<Vec<&'static str>>,
) -> Vec<Vec<String>> {
    let (stream, _) = listener.accept().await.unwrap();
    let mut io = BufReader::new(stream);
    io.get_mut().write_all(b"220 strict\r\n").await.unwrap();
    for _ in 0..2 {
        lines_until(&mut io, "EHLO").await;
        io.get_mut()
            .write_all(b"250-strict\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    for replies in transactions {
        let lines = lines_until(&mut io, "DATA").await;
        for r in &replies {
            io.get_mut()
                .write_all(format!("{r}\r\n").as_bytes())
                .await
                .unwrap();
        }
        if replies.last().is_some_and(|r| r.starts_with("354")) {
            let body = lines_until(&mut io, ".\r\n").await;
            io.get_mut().write_all(b"250 queued\r\n").await.unwrap();
            seen.push(lines.into_iter().chain(body).collect());
        } else {
            seen.push(lines);
        }
    }
    seen
}

async fn relay_on(listener: &TcpListener) -> Relay {
    let port = listener.local_addr().unwrap().port();
    let url = SmtpUrl::parse(&format!("smtp://127.0.0.1:{port}")).unwrap();
    Relay::new(url, Duration::from_secs(5)).unwrap()
}

#[tokio::test]
async fn mail_rcpt_and_data_go_in_one_flight() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = relay_on(&listener).await;
    let peer = tokio::spawn(strict_relay(
        listener,
        vec![vec!["250 ok", "250 ok", "354 go"]],
    ));
    let mut session = relay.connect().await.unwrap();
    assert!(session.pipelining());
    let verdict = relay.send(&mut session, &message("a@example.test")).await;
    assert_eq!(verdict, Verdict::Sent);
    assert!(!session.has_broken());
    let seen = peer.await.unwrap();
    assert_eq!(
        seen[0],
        [
            "MAIL FROM:<news@example.test>\r\n",
            "RCPT TO:<a@example.test>\r\n",
            "DATA\r\n",
            // Dot-stuffed body, then the end.
            "Subject: hi\r\n",
            "\r\n",
            "..leading dot\r\n",
            "bye\r\n",
            "\r\n",
            ".\r\n",
        ]
    );
}

#[tokio::test]
async fn a_refused_recipient_is_judged_by_its_own_reply_and_reset_in_the_next_flight() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = relay_on(&listener).await;
    let peer = tokio::spawn(strict_relay(
        listener,
        vec![
            // The pipelined DATA behind the refused RCPT gets 554:
            // not the verdict.
            vec![
                "250 ok",
                "550 5.1.1 no such user",
                "554 5.5.1 no valid recipients",
            ],
            // RSET, MAIL, RCPT, DATA from here on.
            vec![
                "250 reset",
                "250 ok",
                "452 4.2.2 mailbox full",
                "554 5.5.1 no valid recipients",
            ],
            vec!["250 reset", "250 ok", "250 ok", "354 go"],
        ],
    ));
    let mut session = relay.connect().await.unwrap();
    let Verdict::Permanent(reply) = relay.send(&mut session, &message("x@example.test")).await
    else {
        panic!("550 is permanent")
    };
    assert_eq!(reply.code, Some(550));
    assert!(reply.says_bad_address());
    assert!(
        !session.has_broken(),
        "a refused recipient keeps the session"
    );
    let Verdict::Transient(reply) = relay.send(&mut session, &message("y@example.test")).await
    else {
        panic!("452 is transient")
    };
    assert_eq!(reply.text, "452 4.2.2 mailbox full");
    assert_eq!(
        relay.send(&mut session, &message("z@example.test")).await,
        Verdict::Sent
    );
    let seen = peer.await.unwrap();
    assert_eq!(seen[1][0], "RSET\r\n", "{seen:?}");
    assert_eq!(seen[2][0], "RSET\r\n", "{seen:?}");
    assert_eq!(seen[2][2], "RCPT TO:<z@example.test>\r\n");
}

#[tokio::test]
async fn a_confused_sequence_is_retried_on_a_new_session() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = relay_on(&listener).await;
    let peer = tokio::spawn(strict_relay(
        listener,
        vec![vec![
            "503 5.5.1 nested MAIL",
            "250 ok",
            "554 5.5.1 no valid recipients",
        ]],
    ));
    let mut session = relay.connect().await.unwrap();
    let verdict = relay.send(&mut session, &message("a@example.test")).await;
    assert!(
        matches!(&verdict, Verdict::Transient(r) if r.code == Some(503)),
        "{verdict:?}"
    );
    assert!(session.has_broken());
    peer.await.unwrap();
}

/// A relay that answers each command as it reads it, from `replies` in
/// order (after EHLO), offering PIPELINING or not; it stops when they
/// run out. Returns the commands it read.
async fn lockstep_relay(
    listener: TcpListener,
    pipelining: bool,
    replies: Vec<&'static str>,
) -> Vec<String> {
    let (stream, _) = listener.accept().await.unwrap();
    let mut io = BufReader::new(stream);
    io.get_mut().write_all(b"220 lockstep\r\n").await.unwrap();
    let ehlo: &[u8] = if pipelining {
        b"250-lockstep\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
    } else {
        b"250-lockstep\r\n250 8BITMIME\r\n"
    };
    for _ in 0..2 {
        lines_until(&mut io, "EHLO").await;
        io.get_mut().write_all(ehlo).await.unwrap();
    }
    let mut seen = Vec::new();
    for r in replies {
        let mut line = String::new();
        if io.read_line(&mut line).await.unwrap() == 0 {
            break;
        }
        seen.push(line);
        io.get_mut()
            .write_all(format!("{r}\r\n").as_bytes())
            .await
            .unwrap();
    }
    seen
}

/// Amazon SES over its quota, as Postfix-like relays sequence it: the
/// pipelined MAIL gets `454 Throttling failure`, its RCPT and DATA `503
/// need MAIL command`. The MAIL reply decides: a throttle, transient, the
/// session kept (the 503s are no confusion of ours); the next message
/// goes out after an RSET on the same session.
#[tokio::test]
async fn a_throttled_mail_decides_and_the_503s_behind_it_say_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = relay_on(&listener).await;
    let peer = tokio::spawn(strict_relay(
        listener,
        vec![
            vec![
                "454 4.7.0 Throttling failure: Maximum sending rate exceeded",
                "503 5.5.1 Error: need MAIL command",
                "503 5.5.1 Error: need MAIL command",
            ],
            vec!["250 reset", "250 ok", "250 ok", "354 go"],
        ],
    ));
    let mut session = relay.connect().await.unwrap();
    let verdict = relay.send(&mut session, &message("a@example.test")).await;
    let Verdict::Transient(reply) = &verdict else {
        panic!("a throttled MAIL must defer, not fail: {verdict:?}")
    };
    assert_eq!(reply.code, Some(454), "{reply:?}");
    assert!(reply.throttles(), "{reply:?}");
    assert!(!session.has_broken(), "the 503s are the relay's sequence");
    assert_eq!(
        relay.send(&mut session, &message("a@example.test")).await,
        Verdict::Sent
    );
    let seen = peer.await.unwrap();
    assert_eq!(seen[1][0], "RSET\r\n", "{seen:?}");
}

/// A sender refused for good at MAIL (5xx) is judged the same with and
/// without PIPELINING: permanent, by the MAIL reply (never by the 503
/// behind it, which alone would be a retry on a new session), and not a
/// bad address (no hard bounce of the recipient).
#[tokio::test]
async fn a_refused_sender_is_judged_by_the_mail_reply_with_or_without_pipelining() {
    for pipelining in [true, false] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = relay_on(&listener).await;
        let replies = if pipelining {
            vec![
                "550 5.7.1 sender rejected by policy",
                "503 5.5.1 Error: need MAIL command",
                "503 5.5.1 Error: need MAIL command",
            ]
        } else {
            vec!["550 5.7.1 sender rejected by policy"]
        };
        let peer = tokio::spawn(lockstep_relay(listener, pipelining, replies));
        let mut session = relay.connect().await.unwrap();
        assert_eq!(session.pipelining(), pipelining);
        let verdict = relay.send(&mut session, &message("a@example.test")).await;
        let Verdict::Permanent(reply) = &verdict else {
            panic!("pipelining {pipelining}: {verdict:?}")
        };
        assert_eq!(reply.code, Some(550), "pipelining {pipelining}");
        assert!(!reply.says_bad_address());
        assert!(!session.has_broken(), "pipelining {pipelining}");
        let seen = peer.await.unwrap();
        assert!(seen[0].starts_with("MAIL FROM"), "{seen:?}");
        assert_eq!(seen.len(), if pipelining { 3 } else { 1 }, "{seen:?}");
    }
}
