//! The relay's replies on a plain TCP session, read here from the
//! session's own buffer rather than by lettre: a transaction's replies are
//! four a message, and lettre gives each a `String` for the line, runs its
//! nom parser over it and keeps every line as a `String` of a new `Vec`
//! (~3,400 instructions a reply), where a positive reply is judged by its
//! code alone. The text is only read from a negative reply, with lettre's
//! rules: every line's code the same, lines joined by a blank with a
//! repeated enhanced status code dropped, the same limits on a line (1,000
//! octets) and on a reply (100,000).
//!
//! lettre still reads the greeting, EHLO, AUTH and QUIT (nothing is left
//! in its buffer after a reply: SMTP sends nothing unasked, and no reply
//! of a transaction is read by lettre on a plain session). Under TLS every
//! reply is lettre's.

use std::io;

use super::stream::Outbox;

/// Longest reply line, its CRLF included (lettre's bound).
const MAX_LINE: usize = 1_000;
/// Longest reply (lettre's bound).
const MAX_REPLY: usize = 100_000;
/// What the buffer starts with: a reply is tens of octets.
const INITIAL_ROOM: usize = 1_024;

/// What one reply said.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Heard {
    /// 2xx or 3xx.
    Positive,
    /// 4xx or 5xx: its code and its lines joined as lettre joins them.
    Negative { code: u16, message: String },
}

/// Why no reply could be read, in lettre's words (its error's text): the
/// connection is no longer usable.
pub(super) type Unheard = String;

/// Replies received and not yet read: `buf[start..end]`.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Inbox {
    /// The next reply, reading from `wire` (which first sends what it
    /// holds) until it is whole.
    pub(super) async fn reply(&mut self, wire: &Outbox) -> Result<Heard, Unheard> {
        loop {
            if let Some((heard, used)) = parse(&self.buf[self.start..self.end])? {
                self.start += used;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                return Ok(heard);
            }
            self.make_room();
            let n = wire
                .receive(&mut self.buf[self.end..])
                .await
                .map_err(network)?;
            if n == 0 {
                return Err("response error: incomplete response".into());
            }
            self.end += n;
        }
    }

    /// Unread bytes to the front, and room after them (bounded: [`parse`]
    /// refuses a reply longer than [`MAX_REPLY`]).
    fn make_room(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let room = (2 * self.buf.len()).max(INITIAL_ROOM);
            self.buf.resize(room, 0);
        }
    }
}

fn network(e: io::Error) -> Unheard {
    format!("network error: {e}")
}

/// The reply at the start of `buf` and how many octets it took, or `None`
/// while it is not whole. A line is `CODE-text` (more follow) or `CODE
/// text` (the last), each ending in CRLF.
fn parse(buf: &[u8]) -> Result<Option<(Heard, usize)>, Unheard> {
    let mut at = 0;
    let mut code = None;
    loop {
        let rest = &buf[at..];
        let Some(len) = line_len(rest) else {
            return match rest.len() {
                n if n > MAX_LINE => Err(too_long()),
                n if at + n > MAX_REPLY => Err(too_large()),
                _ => Ok(None),
            };
        };
        if len > MAX_LINE {
            return Err(too_long());
        }
        if at + len > MAX_REPLY {
            return Err(too_large());
        }
        let line = &rest[..len - 2];
        let (this, last) = line_code(line).ok_or_else(malformed)?;
        if *code.get_or_insert(this) != this {
            return Err(malformed());
        }
        at += len;
        if last {
            break;
        }
    }
    let reply = std::str::from_utf8(&buf[..at])
        .map_err(|_| network(io::Error::from(io::ErrorKind::InvalidData)))?;
    let code = code.unwrap_or_default();
    let heard = if code < 400 {
        Heard::Positive
    } else {
        Heard::Negative {
            code,
            message: joined(code, reply),
        }
    };
    Ok(Some((heard, at)))
}

/// The length of the line `buf` starts with, its CRLF included (a bare LF
/// is inside a line, as for lettre).
fn line_len(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'\n', &buf[from..]) {
        let lf = from + i;
        if lf > 0 && buf[lf - 1] == b'\r' {
            return Some(lf + 1);
        }
        from = lf + 1;
    }
    None
}

/// A line's code (2xx to 5xx, second digit 0 to 5, as lettre reads them)
/// and whether it is the reply's last line.
fn line_code(line: &[u8]) -> Option<(u16, bool)> {
    let [a @ b'2'..=b'5', b @ b'0'..=b'5', c @ b'0'..=b'9', sep, ..] = *line else {
        return None;
    };
    let last = match sep {
        b' ' => true,
        b'-' => false,
        _ => return None,
    };
    let digit = |d: u8| u16::from(d - b'0');
    Some((100 * digit(a) + 10 * digit(b) + digit(c), last))
}

/// The lines' texts (each after its code and separator) joined by a blank;
/// an enhanced status code that the first line starts with, and that
/// agrees with the reply's class, is dropped where a later line repeats it
/// (lettre's `message_joined`).
fn joined(code: u16, reply: &str) -> String {
    let mut lines = reply
        .split_terminator("\r\n")
        .map(|line| line.get(4..).unwrap_or_default());
    let Some(first) = lines.next() else {
        return String::new();
    };
    let repeated = enhanced_code(code, first);
    let mut out = String::from(first);
    for line in lines {
        out.push(' ');
        out.push_str(match repeated {
            Some(word) => line
                .strip_prefix(word)
                .filter(|rest| rest.starts_with(' '))
                .map_or(line, str::trim_start),
            None => line,
        });
    }
    out
}

/// The enhanced status code `first` starts with, if its class is the
/// reply's (RFC 2034 §4), each of its other parts one to three digits.
fn enhanced_code(code: u16, first: &str) -> Option<&str> {
    let class = match code / 100 {
        2 => "2",
        4 => "4",
        5 => "5",
        _ => return None,
    };
    let word = first.split_whitespace().next()?;
    let (c, rest) = word.split_once('.')?;
    let (subject, detail) = rest.split_once('.')?;
    let digits = |p: &str| (1..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    (c == class && digits(subject) && digits(detail)).then_some(word)
}

fn malformed() -> Unheard {
    "response error: malformed SMTP reply".into()
}

fn too_long() -> Unheard {
    "response error: SMTP response line too long".into()
}

fn too_large() -> Unheard {
    "response error: SMTP response too large".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn negative(code: u16, message: &str) -> Heard {
        Heard::Negative {
            code,
            message: message.into(),
        }
    }

    #[test]
    fn whole_replies_and_what_they_took() {
        let two = b"250 2.1.0 Ok\r\n354 End data with <CR><LF>.<CR><LF>\r\n";
        assert_eq!(parse(two), Ok(Some((Heard::Positive, 14))));
        assert_eq!(parse(&two[14..]), Ok(Some((Heard::Positive, 37))));
        let multi = b"250-one\r\n250-two\r\n250 three\r\nleft";
        assert_eq!(parse(multi), Ok(Some((Heard::Positive, 29))));
        // Not whole yet: no line end, or only a continued line.
        for part in [
            &b""[..],
            b"250 ok",
            b"250 ok\r",
            b"250 ok\n",
            b"250-one\r\n",
            b"250-one\r\n250 t",
        ] {
            assert_eq!(parse(part), Ok(None), "{part:?}");
        }
    }

    /// The texts lettre's errors carry for the same replies.
    #[test]
    fn negative_replies_joined_as_lettre_joins_them() {
        let gmail = "550-5.7.25 [203.0.113.1] The IP address sending this message does not have a\r\n\
                     550-5.7.25 PTR record setup, or the corresponding forward DNS entry does not\r\n\
                     550 5.7.25 point to the sending IP.\r\n";
        let (heard, used) = parse(gmail.as_bytes()).unwrap().unwrap();
        assert_eq!(used, gmail.len());
        assert_eq!(
            heard,
            negative(
                550,
                "5.7.25 [203.0.113.1] The IP address sending this message does not have a \
                 PTR record setup, or the corresponding forward DNS entry does not \
                 point to the sending IP."
            )
        );
        // A code of another class, or none, is not taken out.
        let odd = b"451-4.3.0 busy\r\n451 2.0.0 later\r\n";
        assert_eq!(
            parse(odd).unwrap().unwrap().0,
            negative(451, "4.3.0 busy 2.0.0 later")
        );
        // A bare LF is part of the line's text.
        let bare = b"550 a\nb\r\n";
        assert_eq!(parse(bare), Ok(Some((negative(550, "a\nb"), 9))));
        let plain = b"421-closing\r\n421 closing\r\n";
        assert_eq!(
            parse(plain).unwrap().unwrap().0,
            negative(421, "closing closing")
        );
        let empty = b"554 \r\n";
        assert_eq!(parse(empty).unwrap().unwrap().0, negative(554, ""));
    }

    #[test]
    fn what_lettre_refuses_is_refused() {
        let bad: [&[u8]; 7] = [
            b"250\r\n",
            b"250ok\r\n",
            b"150 early\r\n",
            b"260 odd\r\n",
            b"25x ok\r\n",
            b"250-one\r\n550 two\r\n",
            b"hello\r\n",
        ];
        for reply in bad {
            assert_eq!(parse(reply), Err(malformed()), "{reply:?}");
        }
        assert_eq!(parse(&[b'x'; MAX_LINE + 1]), Err(too_long()));
        let long = format!("250 {}\r\n", "x".repeat(MAX_LINE));
        assert_eq!(parse(long.as_bytes()), Err(too_long()));
        let many = "250-ok\r\n".repeat(MAX_REPLY / 8 + 1);
        assert_eq!(parse(many.as_bytes()), Err(too_large()));
        assert!(parse(b"250 \xff\r\n").is_err());
    }

    /// Replies that arrive in pieces, several in one read, and the end of
    /// the stream.
    #[tokio::test]
    async fn replies_read_across_and_within_reads() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut relay, _) = listener.accept().await.unwrap();
        let (_stream, wire) = super::super::stream::WriteBehind::new(client);
        let mut inbox = Inbox::default();
        relay
            .write_all(b"250 ok\r\n250-a\r\n250 b\r\n35")
            .await
            .unwrap();
        assert_eq!(inbox.reply(&wire).await, Ok(Heard::Positive));
        assert_eq!(inbox.reply(&wire).await, Ok(Heard::Positive));
        let third = tokio::spawn(async move {
            let heard = inbox.reply(&wire).await;
            (heard, inbox, wire)
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        relay.write_all(b"4 go\r\n550 5.1.1 no\r\n").await.unwrap();
        let (heard, mut inbox, wire) = third.await.unwrap();
        assert_eq!(heard, Ok(Heard::Positive));
        assert_eq!(inbox.reply(&wire).await, Ok(negative(550, "5.1.1 no")));
        drop(relay);
        assert_eq!(
            inbox.reply(&wire).await,
            Err("response error: incomplete response".to_string())
        );
    }
}
