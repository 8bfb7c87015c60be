//! DKIM canonicalization (RFC 6376 §3.4, relaxed/relaxed), the choice of
//! signed header fields (with over-signing), and the folding of the
//! `DKIM-Signature` header we write.

use super::{FOLD_AT, SIGNED_HEADERS};

/// A header built from tokens, folded before a token that would make the
/// line longer than [`FOLD_AT`].
pub(super) struct Folded {
    pub text: String,
    pub line: usize,
}

impl Folded {
    pub fn new(start: String) -> Folded {
        Folded {
            line: start.len(),
            text: start,
        }
    }
    /// Add `token` after a space.
    pub fn push(&mut self, token: &str) {
        self.add(" ", token);
    }
    /// Add `token` right after the previous one (a fold is still allowed).
    pub fn glue(&mut self, token: &str) {
        self.add("", token);
    }
    fn add(&mut self, gap: &str, token: &str) {
        if self.line + gap.len() + token.len() > FOLD_AT {
            self.text.push_str("\r\n\t");
            self.line = 1;
        } else {
            self.text.push_str(gap);
            self.line += gap.len();
        }
        self.text.push_str(token);
        self.line += token.len();
    }
}

/// The header fields (each with its continuation lines, without the final
/// CRLF) and the body of a message.
pub(super) fn split_message(message: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let (head, body) = match find(message, b"\r\n\r\n") {
        Some(at) => (&message[..at + 2], &message[at + 4..]),
        None => (message, &b""[..]),
    };
    let mut fields: Vec<&[u8]> = Vec::new();
    let mut start = 0;
    let mut pos = 0;
    while pos < head.len() {
        let end = find(&head[pos..], b"\r\n").map_or(head.len(), |k| pos + k);
        let next = (end + 2).min(head.len());
        let continues = matches!(head.get(next), Some(b' ' | b'\t'));
        if !continues {
            if end > start {
                fields.push(&head[start..end]);
            }
            start = next;
        }
        pos = next;
    }
    (fields, body)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn field_name(field: &[u8]) -> &[u8] {
    let colon = field.iter().position(|&b| b == b':').unwrap_or(field.len());
    field[..colon].trim_ascii_end()
}

/// The `h=` list: every [`SIGNED_HEADERS`] name the message has, as often
/// as it has it plus once more (over-signing).
pub(super) fn signed_names(fields: &[&[u8]]) -> Vec<&'static str> {
    let mut names = Vec::new();
    for name in SIGNED_HEADERS {
        let present = fields
            .iter()
            .filter(|f| field_name(f).eq_ignore_ascii_case(name.as_bytes()))
            .count();
        if present > 0 {
            names.extend(std::iter::repeat_n(*name, present + 1));
        }
    }
    names
}

/// The fields `names` pick, in order: for each name the last instance not
/// yet picked (RFC 6376 §5.4.2); a name with none left picks nothing.
pub(super) fn select_fields<'a>(fields: &[&'a [u8]], names: &[&str]) -> Vec<&'a [u8]> {
    let mut used = vec![false; fields.len()];
    let mut out = Vec::new();
    for name in names {
        let found = (0..fields.len())
            .rev()
            .find(|&k| !used[k] && field_name(fields[k]).eq_ignore_ascii_case(name.as_bytes()));
        if let Some(k) = found {
            used[k] = true;
            out.push(fields[k]);
        }
    }
    out
}

/// Relaxed header canonicalization (RFC 6376 §3.4.2): lower-case name,
/// unfolded value, runs of blanks as one space, none around the colon or at
/// the end; then CRLF.
pub(super) fn relaxed_field(field: &[u8]) -> Vec<u8> {
    let colon = field.iter().position(|&b| b == b':').unwrap_or(field.len());
    let mut out: Vec<u8> = field[..colon]
        .trim_ascii_end()
        .iter()
        .map(u8::to_ascii_lowercase)
        .collect();
    out.push(b':');
    let (mut blank, mut started) = (false, false);
    for &b in field.get(colon + 1..).unwrap_or_default() {
        match b {
            b'\r' | b'\n' => {}
            b' ' | b'\t' => blank = true,
            _ => {
                if blank && started {
                    out.push(b' ');
                }
                (blank, started) = (false, true);
                out.push(b);
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Relaxed body canonicalization (RFC 6376 §3.4.4): runs of blanks as one
/// space, no blanks at line ends, no empty lines at the end, and a
/// non-empty body ends in CRLF.
pub(super) fn relaxed_body(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 2);
    let mut blank = false;
    let mut k = 0;
    while k < body.len() {
        match body[k] {
            b'\r' if body.get(k + 1) == Some(&b'\n') => {
                blank = false;
                out.extend_from_slice(b"\r\n");
                k += 1;
            }
            b' ' | b'\t' => blank = true,
            b => {
                if blank {
                    out.push(b' ');
                }
                blank = false;
                out.push(b);
            }
        }
        k += 1;
    }
    while out.ends_with(b"\r\n") {
        out.truncate(out.len() - 2);
    }
    if !out.is_empty() {
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaxed_canonicalization_follows_rfc_6376_examples() {
        // RFC 6376 §3.4.6, example 2 (relaxed/relaxed).
        let message = b"A: X\r\nB : Y\t\r\n\tZ  \r\n\r\n C \r\nD \t E\r\n\r\n\r\n";
        let (fields, body) = split_message(message);
        assert_eq!(fields.len(), 2);
        assert_eq!(relaxed_field(fields[0]), b"a:X\r\n");
        assert_eq!(relaxed_field(fields[1]), b"b:Y Z\r\n");
        assert_eq!(
            relaxed_field(b"Subject:  a:  b \r\n\tc "),
            b"subject:a: b c\r\n"
        );
        assert_eq!(relaxed_body(body), b" C\r\nD E\r\n");
        assert_eq!(relaxed_body(b""), b"");
        assert_eq!(relaxed_body(b"\r\n\r\n"), b"");
        assert_eq!(relaxed_body(b"x"), b"x\r\n");
    }

    #[test]
    fn over_signs_present_headers_and_picks_from_the_bottom() {
        let message = b"From: a@x\r\nTo: b@y\r\nX-Other: 1\r\nTo: c@z\r\n\r\nbody\r\n";
        let (fields, _) = split_message(message);
        let names = signed_names(&fields);
        assert_eq!(names, ["From", "From", "To", "To", "To"]);
        let picked = select_fields(&fields, &names);
        assert_eq!(picked, [&b"From: a@x"[..], b"To: c@z", b"To: b@y"]);
    }
}
