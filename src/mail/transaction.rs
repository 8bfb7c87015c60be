//! One message's SMTP transaction on an open [`Session`]: MAIL FROM, RCPT
//! TO, DATA, then the body (dot-stuffed here, see [`dot_stuffed`]) and its
//! final reply.
//!
//! When the relay offers PIPELINING (RFC 2920) the three commands go out in
//! one write, and their three replies are read after it: two round trips
//! per message instead of four. Every reply is read and judged on its own,
//! so a refused recipient fails that message only, with the relay's reply;
//! the DATA that was pipelined behind it then gets 503/554, which says
//! nothing about the recipient and is not taken for its verdict. An
//! unfinished transaction is cleared with RSET, sent in front of the next
//! message's commands (same flight). Without PIPELINING the same commands
//! go one at a time, each waiting for its reply, as lettre does.

use std::fmt::Write as _;

use lettre::transport::smtp::commands::{Data, Mail, Rcpt, Rset};
use lettre::transport::smtp::extension::{Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;
use lettre::transport::smtp::Error as SmtpError;

use super::reply::{classify, Reply, Verdict};
use super::session::Session;
use super::Composed;

/// How one command fared.
enum Step {
    Accepted,
    /// A negative reply (4xx/5xx).
    Refused(SmtpError),
    /// No reply: connection lost, unreadable reply.
    Lost(SmtpError),
}

impl Step {
    fn of(r: Result<Response, SmtpError>) -> Step {
        match r {
            Ok(_) => Step::Accepted,
            Err(e) if e.status().is_some() => Step::Refused(e),
            Err(e) => Step::Lost(e),
        }
    }
}

/// The verdict a negative reply gives, and whether the session survives it.
/// 503 (bad sequence of commands) says the session lost track of the
/// transaction, not that the recipient is bad: retried on a new session.
/// 421 means the relay is closing the session.
fn refusal(e: &SmtpError) -> (Verdict, bool) {
    let verdict = classify(e);
    let code = e.status().map(u16::from);
    match (verdict, code) {
        (Verdict::Permanent(reply), Some(503)) => (Verdict::Transient(reply), true),
        (v, Some(503 | 421)) => (v, true),
        (v, _) => (v, false),
    }
}

fn lost(e: &SmtpError) -> Verdict {
    Verdict::Transient(Reply::local(format!("connection lost: {e}")))
}

impl Session {
    /// MAIL FROM and RCPT TO for `msg`, with the parameters the relay needs
    /// (SMTPUTF8 for a non-ASCII address, BODY=8BITMIME for non-ASCII
    /// text), or the reason it cannot take the message.
    fn envelope_commands(&self, msg: &Composed) -> Result<(Mail, Vec<Rcpt>), Verdict> {
        let info = self.conn.server_info();
        let mut params = Vec::new();
        let from = msg.envelope.from();
        if from
            .into_iter()
            .chain(msg.envelope.to())
            .any(|a: &lettre::Address| !AsRef::<str>::as_ref(a).is_ascii())
        {
            params.push(MailParameter::SmtpUtfEight);
        }
        if !msg.bytes.is_ascii() {
            if !info.supports_feature(Extension::EightBitMime) {
                return Err(Verdict::Permanent(Reply::local(
                    "the message has non-ASCII text, and the relay does not offer 8BITMIME",
                )));
            }
            params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        let rcpts = msg
            .envelope
            .to()
            .iter()
            .map(|a| Rcpt::new(a.clone(), vec![]))
            .collect();
        Ok((Mail::new(from.cloned(), params), rcpts))
    }

    /// Run one transaction and say what it means for the recipient.
    pub(super) async fn transact(&mut self, msg: &Composed) -> Verdict {
        let (mail, rcpts) = match self.envelope_commands(msg) {
            Ok(c) => c,
            Err(refused) => return refused,
        };
        let steps = if self.pipelining {
            self.pipelined(&mail, &rcpts).await
        } else {
            match self.one_by_one(&mail, &rcpts).await {
                Ok(steps) => steps,
                Err(verdict) => return verdict,
            }
        };
        let data_at = rcpts.len() + 1;
        // The first negative reply decides (the 503/554 a pipelined DATA
        // gets behind a refused recipient is not a verdict); a lost
        // connection after it does not change what the relay said.
        let mut verdict = None;
        let mut data_open = false;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Accepted => data_open = i == data_at,
                Step::Refused(e) => {
                    let (v, broken) = refusal(e);
                    if verdict.is_none() {
                        self.broken |= broken;
                        verdict = Some(v);
                    }
                }
                Step::Lost(e) => {
                    self.broken = true;
                    verdict.get_or_insert_with(|| lost(e));
                }
            }
        }
        let verdict = match verdict {
            Some(v) => Some(v),
            // A sequence stops early only on a refusal or a lost
            // connection; anything else is a bug, not the recipient's fault.
            None if steps.len() != data_at + 1 => {
                self.broken = true;
                Some(Verdict::Transient(Reply::local("SMTP replies missing")))
            }
            None => None,
        };
        if let Some(verdict) = verdict {
            self.dirty = true;
            if data_open && !self.broken {
                // A relay that opened DATA though the transaction failed
                // (RFC 2920 says it must not): end it with an empty
                // message and forget the answer.
                if let Step::Lost(_) = Step::of(self.conn.command(".\r\n").await) {
                    self.broken = true;
                }
            }
            return verdict;
        }
        let body = dot_stuffed(&msg.bytes);
        let sent = match std::str::from_utf8(&body) {
            // Written as it is: lettre's `command` writes any text raw.
            Ok(text) => self.conn.command(text).await,
            // Not UTF-8 (never from our composer): lettre's own path.
            Err(_) => self.conn.message(&msg.bytes).await,
        };
        match Step::of(sent) {
            Step::Accepted => Verdict::Sent,
            Step::Refused(e) => {
                let (v, broken) = refusal(&e);
                self.broken |= broken;
                v
            }
            Step::Lost(e) => {
                self.broken = true;
                lost(&e)
            }
        }
    }

    /// RSET (if the last transaction was left open), MAIL, RCPT and DATA
    /// in one write; then every reply, in order, until one is missing.
    /// The RSET's reply is checked here, not returned.
    async fn pipelined(&mut self, mail: &Mail, rcpts: &[Rcpt]) -> Vec<Step> {
        let reset = std::mem::take(&mut self.dirty);
        let mut flight = String::with_capacity(160);
        if reset {
            let _ = write!(flight, "{Rset}");
        }
        let _ = write!(flight, "{mail}");
        for r in rcpts {
            let _ = write!(flight, "{r}");
        }
        let _ = write!(flight, "{Data}");
        let expected = rcpts.len() + 2 + usize::from(reset);
        let mut steps = Vec::with_capacity(expected);
        // lettre writes the flight (held by the write-behind stream until
        // this read: one segment) and reads the first reply.
        steps.push(Step::of(self.conn.command(flight).await));
        while steps.len() < expected && !matches!(steps.last(), Some(Step::Lost(_))) {
            steps.push(Step::of(self.conn.read_response().await));
        }
        if reset {
            match steps.first() {
                Some(Step::Accepted) => {
                    steps.remove(0);
                }
                // Lost: judged as such. Refused: the session is not
                // trusted further; the MAIL behind it tells (503 nested
                // MAIL is retried, see `refusal`).
                Some(Step::Lost(_)) => {}
                _ => {
                    self.broken = true;
                    steps.remove(0);
                }
            }
        }
        steps
    }

    /// Today's exchange for a relay without PIPELINING: each command waits
    /// for its reply; the first refusal ends the sequence. A refused RSET
    /// (nothing of the message sent yet) gives the verdict itself.
    async fn one_by_one(&mut self, mail: &Mail, rcpts: &[Rcpt]) -> Result<Vec<Step>, Verdict> {
        if std::mem::take(&mut self.dirty) {
            match Step::of(self.conn.command(Rset).await) {
                Step::Accepted => {}
                Step::Refused(e) => {
                    self.broken = true;
                    let reply = match classify(&e) {
                        Verdict::Permanent(r) | Verdict::Transient(r) => r,
                        Verdict::Sent => Reply::local("RSET refused"),
                    };
                    return Err(Verdict::Transient(reply));
                }
                Step::Lost(e) => {
                    self.broken = true;
                    return Err(lost(&e));
                }
            }
        }
        let mut steps = Vec::with_capacity(rcpts.len() + 2);
        let commands = std::iter::once(mail.to_string())
            .chain(rcpts.iter().map(ToString::to_string))
            .chain(std::iter::once(Data.to_string()));
        for command in commands {
            let step = Step::of(self.conn.command(command).await);
            let ok = matches!(step, Step::Accepted);
            steps.push(step);
            if !ok {
                break;
            }
        }
        Ok(steps)
    }
}

/// The message as DATA sends it: every line that starts with a dot gets a
/// second one (RFC 5321 4.5.2; a line starts at the message's first byte
/// and after each CRLF), then the end-of-data line, exactly as lettre's
/// `message` sends it. lettre's codec looks at one byte at a time, a cost
/// paid on every byte of every message; this copies the runs between line
/// starts whole.
fn dot_stuffed(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + message.len() / 64 + 6);
    if message.first() == Some(&b'.') {
        out.push(b'.');
    }
    let mut from = 0;
    for at in memchr::memmem::find_iter(message, b"\r\n.") {
        out.extend_from_slice(&message[from..at + 2]);
        out.push(b'.');
        from = at + 2;
    }
    out.extend_from_slice(&message[from..]);
    out.extend_from_slice(b"\r\n.\r\n");
    out
}

#[cfg(test)]
mod tests {
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
}
