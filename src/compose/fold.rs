//! Header values that carry user text (Subject, the From and To display
//! names, the List-Id description), encoded and folded here rather than by
//! lettre, for two reasons:
//!
//! - lettre encodes a display name holding anything but letters, digits,
//!   `-`, `_`, `.`, blanks, `"` and `\` as base64 encoded words: `Linen &
//!   Co` went out as `=?utf-8?b?…?=`, which SpamAssassin scores
//!   (`FROM_EXCESS_BASE64`) and filters weigh as spam. Printable ASCII goes
//!   out here as itself (an atom or a quoted string); only text that needs
//!   it (non-ASCII, or a word too long for any line) becomes encoded words.
//! - lettre folds only at blanks, so one long word stayed on one line: a
//!   3,000-character subject made a 3,009-octet line, over RFC 5322's 998
//!   (Postfix breaks lines at 2,048, which also breaks the DKIM
//!   signature). Here values fold at blanks and between encoded words
//!   within 78 octets where RFC 5322 asks for it; only an ASCII word of up
//!   to [`MAX_PLAIN_WORD`] octets makes a longer line, and no line exceeds
//!   [`MAX_LINE`] whatever the input.
//!
//! Every value built here is printable ASCII with CRLF only before a blank
//! (a fold), so it is safe for [`HeaderValue::dangerous_new_pre_encoded`]:
//! control characters are blanked first ([`super::header_line`]) and every
//! byte outside printable ASCII is inside an encoded word.

use data_encoding::BASE64;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::Mailbox;

/// The line length RFC 5322 asks for ("SHOULD be no more than 78").
pub const FOLD_AT: usize = 78;
/// The line length RFC 5322 requires ("MUST be no more than 998").
pub const MAX_LINE: usize = 998;
/// Longest ASCII word written as itself (RFC 5322 asks for 78-octet
/// lines, but only an encoded word can break a longer word, and spam
/// filters weigh encoding that was not needed): with a blank, quotes and
/// the header's name it stays far below [`MAX_LINE`].
const MAX_PLAIN_WORD: usize = 900;
/// Longest encoded word (RFC 2047 §2).
const MAX_WORD: usize = 75;
/// `=?utf-8?b?` … `?=`.
const WORD_OVERHEAD: usize = 12;
/// Fold rather than start an encoded word with less room than this.
const MIN_ROOM: usize = WORD_OVERHEAD + 12;

/// Whether a display phrase of only atom characters is written bare
/// (`Shop <…>`) or always quoted (`"customers" <…>`, as List-Id is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quote {
    AsNeeded,
    Always,
}

/// `Subject:` (or any unstructured header) for `text`.
pub fn unstructured(name: &'static str, text: &str) -> HeaderValue {
    let text = super::header_line(text);
    let value = match one_line_text(name, &text) {
        Some(value) => value,
        None => written_text(name, &text),
    };
    HeaderValue::dangerous_new_pre_encoded(HeaderName::new_from_ascii_str(name), text, value)
}

/// [`unstructured`]'s value through the [`Writer`]: folded, encoded where
/// needed.
fn written_text(name: &'static str, text: &str) -> String {
    let mut w = Writer::new(name);
    let mut run: Vec<&str> = Vec::new();
    for token in text.split_whitespace() {
        if plain_token(token) {
            w.encoded_run(&run.join(" "), false);
            run.clear();
            w.token(token);
        } else {
            run.push(token);
        }
    }
    w.encoded_run(&run.join(" "), false);
    w.out
}

/// [`unstructured`]'s value when the [`Writer`] would write its words as
/// they are on one line (most subjects): printable ASCII, no `=?`, short
/// enough for the header's first line (see [`one_line_mailbox`]).
fn one_line_text(name: &str, text: &str) -> Option<String> {
    if !text.bytes().all(|b| (0x20..0x7f).contains(&b)) || text.contains("=?") {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    (name.len() + 2 + out.len() <= FOLD_AT).then_some(out)
}

/// A mailbox header (`From:`, `To:`): the display name as a phrase, then
/// the address in angle brackets; a bare address without a name.
pub fn mailbox(name: &'static str, mailbox: &Mailbox) -> HeaderValue {
    let address: &str = mailbox.email.as_ref();
    let display = mailbox.name.as_deref().map(super::header_line);
    let display = display.as_deref().filter(|d| !d.is_empty());
    let value = match one_line_mailbox(name, display, address) {
        Some(value) => value,
        None => written_mailbox(name, display, address),
    };
    HeaderValue::dangerous_new_pre_encoded(
        HeaderName::new_from_ascii_str(name),
        mailbox.to_string(),
        value,
    )
}

/// [`mailbox`]'s value through the [`Writer`]: folded, encoded where needed.
fn written_mailbox(name: &'static str, display: Option<&str>, address: &str) -> String {
    let mut w = Writer::new(name);
    match display {
        Some(d) => {
            w.phrase(d, Quote::AsNeeded);
            w.token(&format!("<{address}>"));
        }
        None => w.token(address),
    }
    w.out
}

/// [`mailbox`]'s value when it is what the [`Writer`] would write without
/// its work (most recipients' To: header): a bare address, or a display
/// name of printable ASCII that, as an atom or a quoted string, fits on
/// the header's first line with the address. Whether the Writer folds
/// depends only on the length of the line it ends with, so a value that
/// fits was not folded; one that does not fit is left to the Writer.
fn one_line_mailbox(name: &str, display: Option<&str>, address: &str) -> Option<String> {
    let Some(d) = display else {
        return Some(address.to_string());
    };
    if !d.bytes().all(|b| (0x20..0x7f).contains(&b)) || d.contains("=?") {
        return None;
    }
    let mut out = String::with_capacity(d.len() + address.len() + 8);
    if d.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    {
        out.push_str(d);
    } else {
        out.push('"');
        for (k, word) in d.split_whitespace().enumerate() {
            if k > 0 {
                out.push(' ');
            }
            for c in word.chars() {
                if matches!(c, '\\' | '"') {
                    out.push('\\');
                }
                out.push(c);
            }
        }
        out.push('"');
    }
    out.push_str(" <");
    out.push_str(address);
    out.push('>');
    (name.len() + 2 + out.len() <= FOLD_AT).then_some(out)
}

/// `PHRASE TAIL`: a display phrase (always quoted when plain) followed by
/// one ASCII token, e.g. List-Id's `"News" <news.example.com>`.
pub fn phrase_then(name: &'static str, phrase: &str, tail: &str) -> HeaderValue {
    let phrase = super::header_line(phrase);
    let mut w = Writer::new(name);
    if !phrase.is_empty() {
        w.phrase(&phrase, Quote::Always);
    }
    w.token(tail);
    w.finish(name, format!("{phrase} {tail}"))
}

/// A token that may go on the wire as itself: printable ASCII, at most
/// [`MAX_PLAIN_WORD`] long, and not mistakable for an encoded word.
fn plain_token(token: &str) -> bool {
    token.len() <= MAX_PLAIN_WORD
        && token.bytes().all(|b| b.is_ascii_graphic())
        && !token.contains("=?")
}

/// A header value being written: the text so far and the length of its
/// last line (the header's name and `: ` count on the first).
struct Writer {
    out: String,
    line: usize,
    first: bool,
}

impl Writer {
    fn new(name: &str) -> Writer {
        Writer {
            out: String::new(),
            line: name.len() + 2,
            first: true,
        }
    }

    /// Start a new token: a blank, or a fold when `len` more octets would
    /// make the line longer than [`FOLD_AT`]. The first token goes right
    /// after the `: `.
    fn separate(&mut self, len: usize) {
        if self.first {
            self.first = false;
        } else if self.line + 1 + len > FOLD_AT {
            self.out.push_str("\r\n ");
            self.line = 1;
        } else {
            self.out.push(' ');
            self.line += 1;
        }
    }

    fn token(&mut self, token: &str) {
        self.separate(token.len());
        self.out.push_str(token);
        self.line += token.len();
    }

    /// A display name: an atom, a quoted string (folded at its blanks), or
    /// encoded words when it holds non-ASCII text or a word longer than
    /// [`MAX_PLAIN_WORD`].
    fn phrase(&mut self, text: &str, quote: Quote) {
        let words: Vec<&str> = text.split_whitespace().collect();
        let printable = text.bytes().all(|b| (0x20..0x7f).contains(&b));
        let fits = words.iter().all(|w| escaped(w).len() + 2 <= MAX_PLAIN_WORD);
        if !printable || !fits || text.contains("=?") {
            return self.encoded_run(&words.join(" "), true);
        }
        let atom = text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
        if atom && quote == Quote::AsNeeded {
            return self.token(text);
        }
        let last = words.len().saturating_sub(1);
        for (k, word) in words.iter().enumerate() {
            let mut t = escaped(word);
            if k == 0 {
                t.insert(0, '"');
            }
            if k == last {
                t.push('"');
            }
            self.token(&t);
        }
    }

    /// `text` as RFC 2047 encoded words (UTF-8; base64 when it holds
    /// non-ASCII, else Q), each filling what is left of its line, folded
    /// between words. `phrase`: only the characters RFC 2047 §5(3) allows
    /// in a display name are left unencoded by Q.
    fn encoded_run(&mut self, text: &str, phrase: bool) {
        if text.is_empty() {
            return;
        }
        let base64 = !text.is_ascii();
        let mut rest = text;
        while !rest.is_empty() {
            let mut room = MAX_WORD.min(FOLD_AT.saturating_sub(self.line + 1));
            if room < MIN_ROOM && !self.first {
                room = MAX_WORD.min(FOLD_AT - 1);
                self.out.push_str("\r\n ");
                self.line = 1;
                self.first = true;
            }
            let (word, tail) = encoded_word(rest, room.max(MIN_ROOM), base64, phrase);
            self.token(&word);
            rest = tail;
        }
    }

    fn finish(self, name: &'static str, raw: impl Into<String>) -> HeaderValue {
        HeaderValue::dangerous_new_pre_encoded(
            HeaderName::new_from_ascii_str(name),
            raw.into(),
            self.out,
        )
    }
}

/// The longest encoded word of at most `room` octets taken from the start
/// of `text` (at least one character), and the text left over.
fn encoded_word(text: &str, room: usize, base64: bool, phrase: bool) -> (String, &str) {
    let budget = room.saturating_sub(WORD_OVERHEAD);
    let mut end = 0;
    let mut len = 0;
    for (i, c) in text.char_indices() {
        let next = i + c.len_utf8();
        let cost = if base64 {
            next.div_ceil(3) * 4 - len
        } else {
            q_len(c, phrase)
        };
        if end > 0 && len + cost > budget {
            break;
        }
        len += cost;
        end = next;
    }
    let (head, tail) = text.split_at(end);
    let word = if base64 {
        format!("=?utf-8?b?{}?=", BASE64.encode(head.as_bytes()))
    } else {
        let mut q = String::with_capacity(len);
        for c in head.chars() {
            q_push(&mut q, c, phrase);
        }
        format!("=?utf-8?q?{q}?=")
    };
    (word, tail)
}

/// `word` as it is written inside a quoted string.
fn escaped(word: &str) -> String {
    word.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Characters Q encoding leaves as they are.
fn q_plain(c: char, phrase: bool) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '!' | '*' | '+' | '-' | '/')
        || (!phrase && c.is_ascii_graphic() && !matches!(c, '=' | '?' | '_' | '(' | ')' | '"'))
}

fn q_len(c: char, phrase: bool) -> usize {
    if c == ' ' || q_plain(c, phrase) {
        1
    } else {
        3 * c.len_utf8()
    }
}

fn q_push(out: &mut String, c: char, phrase: bool) {
    if c == ' ' {
        out.push('_');
    } else if q_plain(c, phrase) {
        out.push(c);
    } else {
        let mut buf = [0u8; 4];
        for b in c.encode_utf8(&mut buf).bytes() {
            out.push_str(&format!("={b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(h: &HeaderValue) -> String {
        let mut headers = lettre::message::header::Headers::new();
        headers.insert_raw(h.clone());
        headers.to_string()
    }

    fn decoded(h: &str) -> String {
        let raw = format!("{h}\r\n");
        let m = mail_parser::MessageParser::default()
            .parse(raw.as_bytes())
            .unwrap();
        m.subject().unwrap_or_default().to_string()
    }

    fn check_lines(h: &str, limit: usize) {
        assert!(h.is_ascii(), "{h}");
        for line in h.trim_end().split("\r\n") {
            assert!(line.len() <= limit, "{} octets: {line}", line.len());
        }
        // Every line break but the last continues the header.
        let breaks = h.matches("\r\n").count();
        assert_eq!(h.matches("\r\n ").count() + 1, breaks, "{h}");
    }

    #[test]
    fn ascii_names_are_quoted_not_encoded() {
        let from = "Linen & Co <news@shop.example>".parse::<Mailbox>().unwrap();
        assert_eq!(
            wire(&mailbox("From", &from)),
            "From: \"Linen & Co\" <news@shop.example>\r\n"
        );
        let shop = "Shop <news@shop.example>".parse::<Mailbox>().unwrap();
        assert_eq!(
            wire(&mailbox("From", &shop)),
            "From: Shop <news@shop.example>\r\n"
        );
        let odd = Mailbox::new(Some("Ada \"Q\" \\ L".into()), "a@b.test".parse().unwrap());
        assert_eq!(
            wire(&mailbox("To", &odd)),
            "To: \"Ada \\\"Q\\\" \\\\ L\" <a@b.test>\r\n"
        );
        let bare = Mailbox::new(None, "a@b.test".parse().unwrap());
        assert_eq!(wire(&mailbox("To", &bare)), "To: a@b.test\r\n");
        let umlaut = Mailbox::new(Some("Müller".into()), "a@b.test".parse().unwrap());
        assert_eq!(
            wire(&mailbox("To", &umlaut)),
            "To: =?utf-8?b?TcO8bGxlcg==?= <a@b.test>\r\n"
        );
        assert_eq!(
            wire(&unstructured("Subject", "Spring sale: 20% off")),
            "Subject: Spring sale: 20% off\r\n"
        );
    }

    /// The short paths write what the Writer writes, up to the fold.
    #[test]
    fn one_line_values_are_what_the_writer_writes() {
        let address = "someone@example.test";
        let names = [
            "User 1".to_string(),
            "Ada".to_string(),
            "Linen & Co".to_string(),
            "Ada \"Q\" \\ L".to_string(),
            "O'Brien".to_string(),
            "a  b".to_string(),
            "=?utf-8?q?x?=".to_string(),
            "Müller".to_string(),
            "x".repeat(40),
            "y ".repeat(30),
        ];
        let mut short = 0;
        for n in 0..60 {
            for d in &names {
                let d = format!("{d}{}", "z".repeat(n));
                let written = written_mailbox("To", Some(&d), address);
                if let Some(line) = one_line_mailbox("To", Some(&d), address) {
                    assert_eq!(line, written, "{d:?}");
                    short += 1;
                } else {
                    let plain = d.is_ascii() && !d.contains("=?");
                    assert!(!plain || written.contains("\r\n"), "{d:?}: {written}");
                }
            }
        }
        assert!(short > 100, "{short}");
        let mut short = 0;
        for n in 0..80 {
            for d in &names {
                let text = format!("{d} {}", "w".repeat(n));
                let written = written_text("Subject", &text);
                if let Some(line) = one_line_text("Subject", &text) {
                    assert_eq!(line, written, "{text:?}");
                    short += 1;
                } else {
                    let plain = text.is_ascii() && !text.contains("=?");
                    assert!(!plain || written.contains("\r\n"), "{text:?}: {written}");
                }
            }
        }
        assert!(short > 100, "{short}");
        assert_eq!(one_line_text("Subject", ""), Some(String::new()));
        assert_eq!(written_text("Subject", ""), "");
        assert_eq!(
            one_line_mailbox("To", None, address).as_deref(),
            Some(address)
        );
    }

    #[test]
    fn long_values_fold_within_78_and_decode_to_the_text() {
        let texts = [
            "x".repeat(3_000),
            "ü".repeat(1_500),
            "word ".repeat(600),
            format!("{} tail {}", "a".repeat(1_000), "€".repeat(90)),
            "=?utf-8?b?QQ==?= is text".to_string(),
        ];
        for text in &texts {
            let h = wire(&unstructured("Subject", text));
            check_lines(&h, FOLD_AT);
            assert_eq!(decoded(&h), text.trim(), "{h}");
            let m = Mailbox::new(Some(text.clone()), "a@b.test".parse().unwrap());
            check_lines(&wire(&mailbox("From", &m)), FOLD_AT);
            check_lines(&wire(&phrase_then("List-Id", text, "<l.b.test>")), FOLD_AT);
        }
        // A long ASCII word stays as it is where a line can hold it.
        let word = "y".repeat(MAX_PLAIN_WORD);
        let h = wire(&unstructured("Subject", &format!("see {word}")));
        check_lines(&h, MAX_LINE);
        assert_eq!(h, format!("Subject: see\r\n {word}\r\n"));
    }
}
