//! One message's SMTP transaction on an open [`Session`]: MAIL FROM, RCPT
//! TO, DATA, then the body (dot-stuffed here, see [`dot_stuffed`]) and its
//! final reply.
//!
//! When the relay offers PIPELINING (RFC 2920) the three commands go out in
//! one write, and their three replies are read after it: two round trips
//! per message instead of four. Every reply is read, and the first
//! negative one decides (see `Session::judge`): a refused recipient fails
//! that message only, with the relay's reply; the DATA that was pipelined
//! behind it then gets 503/554, which says nothing about the recipient and
//! is not taken for its verdict. Likewise a refused MAIL FROM decides for
//! the whole transaction, whatever its RCPTs and DATA were answered: a
//! relay's throttle at MAIL (`454 Throttling failure`) defers the
//! recipients, the `503 need MAIL` behind it never fails them. An
//! unfinished transaction is cleared with RSET, sent in front of the next
//! message's commands (same flight). Without PIPELINING the same commands
//! go one at a time, each waiting for its reply, as lettre does.

use std::fmt::Write as _;

use lettre::transport::smtp::commands::{Data, Mail, Rcpt, Rset};
use lettre::transport::smtp::extension::{Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;
use lettre::transport::smtp::Error as SmtpError;

use super::replies::{Heard, Unheard};
use super::reply::{Reply, Verdict};
use super::session::Session;
use super::Composed;

/// How one command fared.
enum Step {
    Accepted,
    /// A negative reply (4xx/5xx): its code and its lines joined.
    Refused {
        code: u16,
        message: String,
    },
    /// No reply (connection lost, unreadable reply): why.
    Lost(String),
}

impl Step {
    /// A reply as lettre read it (under TLS).
    fn of(r: Result<Response, SmtpError>) -> Step {
        match r {
            Ok(_) => Step::Accepted,
            Err(e) => match e.status() {
                Some(code) => Step::Refused {
                    code: code.into(),
                    message: std::error::Error::source(&e)
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                },
                None => Step::Lost(e.to_string()),
            },
        }
    }

    /// A reply as the session read it (on plain TCP).
    fn heard(r: Result<Heard, Unheard>) -> Step {
        match r {
            Ok(Heard::Positive) => Step::Accepted,
            Ok(Heard::Negative { code, message }) => Step::Refused { code, message },
            Err(why) => Step::Lost(why),
        }
    }
}

/// The verdict a negative reply gives, and whether the session survives it.
/// 5xx is permanent, 4xx transient; but 503 (bad sequence of commands) says
/// the session lost track of the transaction, not that the recipient is
/// bad: retried on a new session. 421 means the relay is closing the
/// session.
fn refusal(code: u16, message: &str) -> (Verdict, bool) {
    let reply = Reply::from_relay(code, message);
    match code {
        503 | 421 => (Verdict::Transient(reply), true),
        500.. => (Verdict::Permanent(reply), false),
        _ => (Verdict::Transient(reply), false),
    }
}

fn lost(why: &str) -> Verdict {
    Verdict::Transient(Reply::local(format!("connection lost: {why}")))
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
        let (verdict, data_open) = self.judge(&steps, rcpts.len() + 1);
        if let Some(verdict) = verdict {
            self.dirty = true;
            if data_open && !self.broken {
                // A relay that opened DATA though the transaction failed
                // (RFC 2920 says it must not): end it with an empty
                // message and forget the answer.
                if let Step::Lost(_) = self.exchange(".\r\n").await {
                    self.broken = true;
                }
            }
            return verdict;
        }
        match self.send_body(&msg.bytes).await {
            Step::Accepted => Verdict::Sent,
            Step::Refused { code, message } => {
                let (v, broken) = refusal(code, &message);
                self.broken |= broken;
                v
            }
            Step::Lost(why) => {
                self.broken = true;
                lost(&why)
            }
        }
    }

    /// Send `command` and read the reply to it: on plain TCP with the
    /// session's own reader (see `super::replies`), under TLS with lettre.
    async fn exchange(&mut self, command: &str) -> Step {
        match &self.outbox {
            Some(outbox) => {
                outbox.append(|out| out.extend_from_slice(command.as_bytes()));
                Step::heard(self.inbox.reply(outbox).await)
            }
            None => Step::of(self.conn.command(command).await),
        }
    }

    /// The next reply of a pipelined flight (see [`Self::exchange`]).
    async fn next_reply(&mut self) -> Step {
        match &self.outbox {
            Some(outbox) => Step::heard(self.inbox.reply(outbox).await),
            None => Step::of(self.conn.read_response().await),
        }
    }

    /// The body after an accepted DATA, and the relay's reply to it. On
    /// plain TCP it is dot-stuffed straight into the stream's write buffer
    /// (one copy), sent when the reply is awaited; under TLS it goes
    /// through lettre, which writes any text raw.
    async fn send_body(&mut self, bytes: &[u8]) -> Step {
        match &self.outbox {
            Some(outbox) => {
                outbox.append(|out| dot_stuff_into(bytes, out));
                Step::heard(self.inbox.reply(outbox).await)
            }
            None => {
                let body = dot_stuffed(bytes);
                Step::of(match std::str::from_utf8(&body) {
                    Ok(text) => self.conn.command(text).await,
                    // Not UTF-8 (never from our composer): lettre's own path.
                    Err(_) => self.conn.message(bytes).await,
                })
            }
        }
    }

    /// What the replies of one transaction (MAIL, each RCPT, DATA) say
    /// for the recipient, if anything went wrong; and whether the relay
    /// opened DATA. The first negative reply decides: a refused MAIL
    /// decides alone (RFC 2920: the 503 "need MAIL command" or 554 its
    /// pipelined RCPTs and DATA then get answers a transaction that never
    /// began, and says nothing about the recipients: a throttled MAIL
    /// defers them, it never fails them); so does a refused RCPT for the
    /// DATA behind it. A lost connection after the verdict does not change
    /// what the relay said.
    fn judge(&mut self, steps: &[Step], data_at: usize) -> (Option<Verdict>, bool) {
        let mut verdict = None;
        let mut data_open = false;
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Accepted => data_open = i == data_at,
                Step::Refused { code, message } if verdict.is_none() => {
                    let (v, broken) = refusal(*code, message);
                    self.broken |= broken;
                    verdict = Some(v);
                }
                Step::Refused { .. } => {}
                Step::Lost(why) => {
                    self.broken = true;
                    verdict.get_or_insert_with(|| lost(why));
                }
            }
        }
        match verdict {
            Some(v) => (Some(v), data_open),
            // A sequence stops early only on a refusal or a lost
            // connection; anything else is a bug, not the recipient's fault.
            None if steps.len() != data_at + 1 => {
                self.broken = true;
                let missing = Verdict::Transient(Reply::local("SMTP replies missing"));
                (Some(missing), data_open)
            }
            None => (None, data_open),
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
        // The flight is held by the write-behind stream until the first
        // reply is awaited: one segment.
        steps.push(self.exchange(&flight).await);
        while steps.len() < expected && !matches!(steps.last(), Some(Step::Lost(_))) {
            steps.push(self.next_reply().await);
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
            match self.exchange(&Rset.to_string()).await {
                Step::Accepted => {}
                Step::Refused { code, message } => {
                    self.broken = true;
                    return Err(Verdict::Transient(Reply::from_relay(code, &message)));
                }
                Step::Lost(why) => {
                    self.broken = true;
                    return Err(lost(&why));
                }
            }
        }
        let mut steps = Vec::with_capacity(rcpts.len() + 2);
        let commands = std::iter::once(mail.to_string())
            .chain(rcpts.iter().map(ToString::to_string))
            .chain(std::iter::once(Data.to_string()));
        for command in commands {
            let step = self.exchange(&command).await;
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
    let mut out = Vec::new();
    dot_stuff_into(message, &mut out);
    out
}

/// [`dot_stuffed`], appended to `out`.
fn dot_stuff_into(message: &[u8], out: &mut Vec<u8>) {
    out.reserve(message.len() + message.len() / 64 + 6);
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
}

#[cfg(test)]
mod tests;
