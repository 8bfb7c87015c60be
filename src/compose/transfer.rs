//! The transfer encoding of a message's text and HTML parts.
//!
//! lettre chooses quoted-printable for any part with a line of 76 octets
//! or more (an HTML part with inlined CSS always has some) or with any
//! non-ASCII character, encodes the whole part per message, and makes its
//! line ends CRLF by inserting one `\r` at a time (a move of the rest of
//! the part each), work that grows with every message's size. Here:
//!
//! - A part that is ASCII, holds no NUL and no line over 998 octets is
//!   valid as `7bit` as it stands (RFC 5322 §2.1.1, RFC 2045 §2.7): it goes
//!   out unchanged but for its line ends, made CRLF in one pass.
//! - An HTML part is made ASCII first: each non-ASCII character becomes a
//!   numeric character reference (`€` → `&#8364;`), which HTML decodes to
//!   the same character in text and in attribute values alike. Not inside
//!   `<style>` or `<script>`, whose text is not decoded: a non-ASCII
//!   character there leaves the part to lettre.
//! - Anything else (non-ASCII plain text, a longer line) gets its line ends
//!   made CRLF in one pass and then the encoding lettre would choose,
//!   quoted-printable (by the `quoted_printable` crate, lettre's own
//!   encoder) or base64, which every relay takes (8bit would need the
//!   relay's 8BITMIME, which is not known while composing).

use std::fmt::Write as _;

use lettre::message::header::ContentTransferEncoding;
use lettre::message::Body;

/// The longest line a `7bit` part may have, CRLF excluded (RFC 5322).
pub const MAX_LINE: usize = 998;

/// A plain-text part's body: `7bit` when it can be; else quoted-printable
/// when at most a third of it needs escaping, as lettre would choose (with
/// the same encoder), without lettre's scans; else lettre's base64.
pub fn text(text: String) -> Body {
    let bytes = text.as_bytes();
    if bytes.is_ascii() && memchr::memchr(0, bytes).is_none() {
        if let Some(crlf) = crlf(bytes, MAX_LINE) {
            return Body::dangerous_pre_encoded(crlf, ContentTransferEncoding::SevenBit);
        }
    }
    let Some(crlf) = crlf(bytes, usize::MAX) else {
        return Body::new(text);
    };
    let escaped = crlf
        .iter()
        .filter(|b| !matches!(b, b'\t' | b' '..=b'~'))
        .count();
    if escaped <= crlf.len() / 3 {
        let encoded = quoted_printable::encode(&crlf);
        Body::dangerous_pre_encoded(encoded, ContentTransferEncoding::QuotedPrintable)
    } else {
        // Bytes, not a string: lettre leaves their line ends alone.
        Body::new(crlf)
    }
}

/// An HTML part's body: made ASCII (see the module doc), then as [`text`].
pub fn html(html: String) -> Body {
    if html.is_ascii() {
        return text(html);
    }
    match html_ascii(&html) {
        Some(ascii) => text(ascii),
        None => text(html),
    }
}

/// `text` with every line end (`\n`, `\r\n` or a lone `\r`) made CRLF in
/// one pass, or `None` if a line is longer than `limit` octets.
fn crlf(text: &[u8], limit: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() + text.len() / 16 + 2);
    let mut rest = text;
    loop {
        let Some(end) = memchr::memchr2(b'\r', b'\n', rest) else {
            return (rest.len() <= limit).then(|| {
                out.extend_from_slice(rest);
                out
            });
        };
        if end > limit {
            return None;
        }
        out.extend_from_slice(&rest[..end]);
        out.extend_from_slice(b"\r\n");
        let pair = rest[end] == b'\r' && rest.get(end + 1) == Some(&b'\n');
        rest = &rest[end + if pair { 2 } else { 1 }..];
    }
}

/// `html` with every non-ASCII character written as a numeric character
/// reference, or `None` when one is inside `<style>` or `<script>`.
fn html_ascii(html: &str) -> Option<String> {
    let b = html.as_bytes();
    let raw = raw_text(b);
    let mut out = String::with_capacity(b.len() + b.len() / 8);
    let mut copied = 0;
    let mut at = 0;
    while let Some(i) = next_non_ascii(b, at) {
        if raw.iter().any(|r| r.contains(&i)) {
            return None;
        }
        // Only whole characters are stepped over, so `i` starts one.
        let c = html[i..].chars().next()?;
        out.push_str(&html[copied..i]);
        let _ = write!(out, "&#{};", u32::from(c));
        at = i + c.len_utf8();
        copied = at;
    }
    out.push_str(&html[copied..]);
    Some(out)
}

/// The first non-ASCII byte at or after `from`, checked a word at a time
/// (`is_ascii`) over 64-byte stretches.
fn next_non_ascii(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < b.len() {
        let end = b.len().min(i + 64);
        if !b[i..end].is_ascii() {
            return b[i..end].iter().position(|&c| c >= 0x80).map(|p| i + p);
        }
        i = end;
    }
    None
}

/// The byte ranges of the `<style>` and `<script>` elements' raw text.
fn raw_text(b: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let mut from = 0;
    while let Some(off) = memchr::memchr(b'<', &b[from..]) {
        let i = from + off;
        from = match raw_text_end(b, i) {
            Some(end) => {
                ranges.push(i..end);
                end.max(i + 1)
            }
            None => i + 1,
        };
    }
    ranges
}

/// Where the raw text of a `<style>` or `<script>` element opened at `i`
/// ends (its closing tag, or the end of the part); `None` for any other
/// tag.
fn raw_text_end(b: &[u8], i: usize) -> Option<usize> {
    let close: &[u8] = [&b"</style"[..], b"</script"].into_iter().find(|close| {
        let open = &close[2..];
        let name_end = i + 1 + open.len();
        b.len() > name_end
            && b[i + 1..name_end].eq_ignore_ascii_case(open)
            && matches!(
                b[name_end],
                b'>' | b'/' | b' ' | b'\t' | b'\r' | b'\n' | b'\x0c'
            )
    })?;
    let mut from = i + 1;
    while let Some(off) = memchr::memchr(b'<', &b[from..]) {
        let j = from + off;
        if b.len() >= j + close.len() && b[j..j + close.len()].eq_ignore_ascii_case(close) {
            return Some(j);
        }
        from = j + 1;
    }
    Some(b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(s: &str) -> (ContentTransferEncoding, Vec<u8>) {
        let b = text(s.to_string());
        (b.encoding(), b.into_vec())
    }

    #[test]
    fn ascii_with_long_lines_goes_out_as_it_is_with_crlf_line_ends() {
        let line = format!("<td style=\"color: #333\">{}</td>", "x".repeat(200));
        let (enc, bytes) = encoded(&format!("{line}\n<p>a</p>\r\nb\rc\n"));
        assert_eq!(enc, ContentTransferEncoding::SevenBit);
        assert_eq!(
            bytes,
            format!("{line}\r\n<p>a</p>\r\nb\r\nc\r\n").into_bytes()
        );
        // lettre alone would have made it quoted-printable (`=3D`).
        assert_eq!(
            Body::new(line.clone()).encoding(),
            ContentTransferEncoding::QuotedPrintable
        );
    }

    #[test]
    fn a_line_at_the_limit_is_7bit_and_one_octet_more_is_not() {
        let at = "a".repeat(MAX_LINE);
        assert_eq!(encoded(&at).0, ContentTransferEncoding::SevenBit);
        assert_eq!(
            encoded(&format!("{at}\r\n{at}")).0,
            ContentTransferEncoding::SevenBit
        );
        let over = "a".repeat(MAX_LINE + 1);
        for text in [over.clone(), format!("{over}\n"), format!("ok\n{over}\nok")] {
            let (enc, bytes) = encoded(&text);
            assert_ne!(enc, ContentTransferEncoding::SevenBit);
            assert!(bytes.split(|&b| b == b'\n').all(|l| l.len() <= 78));
        }
    }

    #[test]
    fn non_ascii_and_nul_are_left_to_lettre() {
        assert_eq!(
            encoded("Viele Grüße aus Berlin\n").0,
            ContentTransferEncoding::QuotedPrintable
        );
        assert_ne!(encoded("a\0b").0, ContentTransferEncoding::SevenBit);
        assert_eq!(encoded("").0, ContentTransferEncoding::SevenBit);
    }

    fn html_of(s: &str) -> (ContentTransferEncoding, String) {
        let b = html(s.to_string());
        let enc = b.encoding();
        (enc, String::from_utf8(b.into_vec()).expect("ASCII"))
    }

    #[test]
    fn non_ascii_html_becomes_character_references_outside_style_and_script() {
        let (enc, out) = html_of("<p title=\"Grüße\">€ 49 — ok</p>\n<STYLE>a{}</STYLE>😀");
        assert_eq!(enc, ContentTransferEncoding::SevenBit);
        assert_eq!(
            out,
            "<p title=\"Gr&#252;&#223;e\">&#8364; 49 &#8212; ok</p>\r\n<STYLE>a{}</STYLE>&#128512;"
        );
        // A tag that only starts like one is no raw-text element.
        assert_eq!(html_of("<styles>é</styles>").1, "<styles>&#233;</styles>");
    }

    #[test]
    fn non_ascii_inside_style_or_script_is_left_to_lettre() {
        for raw in [
            "<style>p { font-family: \"メイリオ\" }</style><p>é</p>",
            "<p>a</p><script type=x>var s = \"é\";</script>",
            "<style>p{}</style><style>q::after { content: \"→\" }",
        ] {
            let b = html(raw.to_string());
            assert_eq!(
                b.encoding(),
                ContentTransferEncoding::QuotedPrintable,
                "{raw}"
            );
        }
    }

    #[test]
    fn mostly_non_ascii_text_is_base64_as_lettre_would_choose() {
        let cjk = "こんにちは、世界。今月のお知らせです。\n".repeat(3);
        assert_eq!(encoded(&cjk).0, ContentTransferEncoding::Base64);
        assert_eq!(
            Body::new(cjk.clone()).encoding(),
            ContentTransferEncoding::Base64
        );
    }

    #[test]
    fn parts_lettre_encodes_get_crlf_line_ends_first() {
        let b = text("Viele Grüße aus Berlin\nzwei\rdrei\r\n".to_string());
        assert_eq!(b.encoding(), ContentTransferEncoding::QuotedPrintable);
        assert_eq!(
            b.into_vec(),
            b"Viele Gr=C3=BC=C3=9Fe aus Berlin\r\nzwei\r\ndrei\r\n".to_vec()
        );
    }
}
