//! Secrets never reach a message, a log line or a banner: every URL that
//! may hold a password (SMTP relay, database) is shown through [`url`]
//! first, also when it does not parse. A text that may quote a URL or its
//! password (a driver's error message, a command-line parser's complaint,
//! a `Debug` print) goes through [`scrub`] or [`text`]. Everything works on
//! text, never on a parsed URL, so a URL too broken to parse is hidden the
//! same way.

use std::fmt;

/// What stands in for a hidden secret.
pub const HIDDEN: &str = "***";

/// Query parameters whose values are secrets (`postgres://…?password=…`).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "pass",
    "passwd",
    "secret",
    "token",
    "sslpassword",
];

/// A URL cut where its secrets are: `scheme://user:PASSWORD@host/path?query`.
struct Parts<'a> {
    /// `scheme://`, or empty when there is none.
    scheme: &'a str,
    /// The authority: `user:password@host:port`.
    authority: &'a str,
    /// Path, query and fragment.
    tail: &'a str,
}

impl<'a> Parts<'a> {
    fn of(raw: &'a str) -> Parts<'a> {
        let (scheme, rest) = match raw.find("://") {
            Some(k) => raw.split_at(k + 3),
            None => ("", raw),
        };
        // The authority ends at the first '/', '?' or '#' after the last '@'
        // (a password may itself hold '/', '?' or '#' when it is not encoded).
        let from = rest.rfind('@').map_or(0, |k| k + 1);
        let authority_end = rest[from..]
            .find(['/', '?', '#'])
            .map_or(rest.len(), |k| from + k);
        let (authority, tail) = rest.split_at(authority_end);
        Parts {
            scheme,
            authority,
            tail,
        }
    }

    /// The user-info's user, password and the host part (from the last
    /// '@' on), when there is a password.
    fn userinfo(&self) -> Option<(&'a str, &'a str, &'a str)> {
        if self.scheme.is_empty() {
            return None;
        }
        let (userinfo, host) = self.authority.split_at(self.authority.rfind('@')?);
        let (user, password) = userinfo.split_once(':')?;
        Some((user, password, host))
    }

    /// The query's `key=value` pairs, and the fragment.
    fn query(&self) -> Option<(&'a str, Vec<&'a str>, Option<&'a str>)> {
        let (path, q) = self.tail.split_once('?')?;
        let (q, fragment) = match q.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (q, None),
        };
        Some((path, q.split('&').collect(), fragment))
    }
}

/// Whether a query parameter's value is a secret.
fn secret_param(pair: &str) -> Option<(&str, &str)> {
    pair.split_once('=')
        .filter(|(k, _)| SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()))
}

/// `raw` with the password of its user-info and the values of secret query
/// parameters replaced by [`HIDDEN`]: everything between the first `:`
/// after `scheme://` and the last `@` of the authority goes.
pub fn url(raw: &str) -> String {
    let parts = Parts::of(raw);
    let authority = match parts.userinfo() {
        Some((user, _, host)) => format!("{user}:{HIDDEN}{host}"),
        None => parts.authority.to_string(),
    };
    let tail = match parts.query() {
        None => parts.tail.to_string(),
        Some((path, pairs, fragment)) => {
            let pairs: Vec<String> = pairs
                .into_iter()
                .map(|pair| match secret_param(pair) {
                    Some((k, _)) => format!("{k}={HIDDEN}"),
                    None => pair.to_string(),
                })
                .collect();
            let mut out = format!("{path}?{}", pairs.join("&"));
            if let Some(f) = fragment {
                out.push('#');
                out.push_str(f);
            }
            out
        }
    };
    format!("{}{authority}{tail}", parts.scheme)
}

/// Whether `raw` holds a secret (a password, a secret query value).
pub fn has_secret(raw: &str) -> bool {
    !secrets(raw).is_empty()
}

/// The secrets `raw` holds (its password, secret query values), each as
/// written and percent-decoded: what must not appear in a text about it.
fn secrets(raw: &str) -> Vec<String> {
    let parts = Parts::of(raw);
    let mut written: Vec<&str> = parts.userinfo().map(|(_, p, _)| p).into_iter().collect();
    if let Some((_, pairs, _)) = parts.query() {
        written.extend(
            pairs
                .into_iter()
                .filter_map(|p| secret_param(p).map(|(_, v)| v)),
        );
    }
    let mut out = Vec::new();
    for secret in written.into_iter().filter(|s| !s.is_empty()) {
        let decoded = percent_encoding::percent_decode_str(secret)
            .decode_utf8_lossy()
            .into_owned();
        out.push(secret.to_string());
        if decoded != secret {
            out.push(decoded);
        }
    }
    // Longest first, so a secret that contains another is hidden whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// `message` (say, a database driver's error about `raw_url`) with every
/// copy of the URL shown through [`url`] and every other trace of its
/// secrets (libpq quotes a badly encoded password on its own:
/// `invalid percent-encoded token: "…"`) replaced by [`HIDDEN`].
pub fn scrub(message: &str, raw_url: &str) -> String {
    let mut out = if raw_url.is_empty() {
        message.to_string()
    } else {
        message.replace(raw_url, &url(raw_url))
    };
    for secret in secrets(raw_url) {
        out = hide(&out, &secret);
    }
    text(&out)
}

/// `message` with every copy of `secret` (a password already decoded, say
/// one a relay's reply might echo) replaced by [`HIDDEN`].
pub fn hide(message: &str, secret: &str) -> String {
    if secret.is_empty() {
        message.to_string()
    } else {
        message.replace(secret, HIDDEN)
    }
}

/// What ends a sentence or clause right after an unquoted URL.
const SENTENCE_PUNCTUATION: &[char] = &[':', ',', ';', '.', ')'];

/// Free text with every URL in it shown through [`url`]. A URL runs from
/// its scheme to the closing quote when it is quoted (`'…'`, `"…"`, as
/// clap and `{:?}` quote values), else to the next white space, less the
/// punctuation that closes a clause there (`URL: refused`, `URL, then`).
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(k) = rest.find("://") {
        let scheme_char = |c: char| c.is_ascii_alphanumeric() || "+.-".contains(c);
        let start = rest[..k]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| scheme_char(c))
            .last()
            .map_or(k, |(i, _)| i);
        let quote = rest[..start]
            .chars()
            .next_back()
            .filter(|c| matches!(c, '"' | '\'' | '`'));
        // "://" is never a quote or white space, so `end` > `k`: progress.
        let end = match quote {
            Some(q) => rest[k..].find(q),
            None => rest[k..].find(char::is_whitespace),
        }
        .map_or(rest.len(), |e| k + e);
        // Unquoted, a URL followed by `:`, `,` or `.` (`connecting to
        // URL: refused`) ends before that punctuation: else it would count
        // as part of the last secret query value and be hidden with it.
        let end = match quote {
            Some(_) => end,
            None => k + rest[k..end].trim_end_matches(SENTENCE_PUNCTUATION).len(),
        }
        .max(k + 3);
        out.push_str(&rest[..start]);
        out.push_str(&url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A URL that prints (with `{}` and `{:?}`) through [`url`]: for `Debug`
/// impls of settings that hold one.
pub struct Url<'a>(pub &'a str);

impl fmt::Display for Url<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&url(self.0))
    }
}

impl fmt::Debug for Url<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&url(self.0), f)
    }
}

/// A secret that prints as [`HIDDEN`] (tokens, passwords) in `Debug` impls.
pub struct Hidden;

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HIDDEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_in_good_and_broken_urls() {
        for (raw, shown) in [
            ("smtp://u:s3cr3t@relay:587", "smtp://u:***@relay:587"),
            (
                "smtp://u:s3cr3t@relay:notaport",
                "smtp://u:***@relay:notaport",
            ),
            ("postgres://me:p@ss/w?rd@db/x", "postgres://me:***@db/x"),
            (
                "postgres://me@db/x?password=hunter2&sslmode=require",
                "postgres://me@db/x?password=***&sslmode=require",
            ),
            ("smtp://relay:25", "smtp://relay:25"),
            ("sqlite://mailsplit.db", "sqlite://mailsplit.db"),
            ("not a url at all", "not a url at all"),
            ("smtp://u:pa ss@@host", "smtp://u:***@host"),
        ] {
            assert_eq!(url(raw), shown, "{raw}");
        }
    }

    #[test]
    fn scrub_hides_a_password_quoted_alone() {
        let raw = "postgres://u:p%zzS3CRET@db/x";
        let libpq = "invalid percent-encoded token: \"p%zzS3CRET\"";
        let shown = scrub(libpq, raw);
        assert!(!shown.contains("S3CRET"), "{shown}");
        assert!(shown.contains("invalid percent-encoded token"), "{shown}");
        // Decoded as well as written; the URL itself through `url`.
        let raw = "smtp://u:a%2Bb%40c@relay:25";
        let shown = scrub(&format!("login a+b@c refused by {raw}"), raw);
        assert_eq!(shown, "login *** refused by smtp://u:***@relay:25");
        let raw = "postgres://db/x?password=Hunter2";
        assert!(!scrub("bad option Hunter2", raw).contains("Hunter2"));
    }

    #[test]
    fn text_hides_urls_in_free_text() {
        for (raw, shown) in [
            (
                "error: unexpected argument 'smtp://u:pa ss@h:25' found",
                "error: unexpected argument 'smtp://u:***@h:25' found",
            ),
            (
                "bad URL \"postgres://me:pw@db/x\": nope",
                "bad URL \"postgres://me:***@db/x\": nope",
            ),
            (
                "relay smtp://u:pw@h:25 and db postgres://a:b@c/d.",
                "relay smtp://u:***@h:25 and db postgres://a:***@c/d.",
            ),
            ("no urls here: a@b, c:d", "no urls here: a@b, c:d"),
            (
                "ünïcode before smtp://u:pw@h",
                "ünïcode before smtp://u:***@h",
            ),
            ("://odd", "://odd"),
            ("a://: b", "a://: b"),
        ] {
            assert_eq!(text(raw), shown, "{raw}");
        }
    }

    #[test]
    fn the_punctuation_after_a_url_survives() {
        for (raw, shown) in [
            (
                "connecting to postgres://u:secret@h/db: connection refused",
                "connecting to postgres://u:***@h/db: connection refused",
            ),
            (
                "connecting to postgres://u:secret@h:5432: connection refused",
                "connecting to postgres://u:***@h:5432: connection refused",
            ),
            (
                "connecting to postgres://me@db/x?password=hunter2: connection refused",
                "connecting to postgres://me@db/x?password=***: connection refused",
            ),
            (
                "tried postgres://me@db/x?sslmode=require&password=hunter2, then gave up.",
                "tried postgres://me@db/x?sslmode=require&password=***, then gave up.",
            ),
            (
                "source (mysql://root@db/x?pass=hunter2): refused",
                "source (mysql://root@db/x?pass=***): refused",
            ),
            ("relay smtp://u:pw@h:25.", "relay smtp://u:***@h:25."),
            (
                "quoted 'postgres://me@db/x?password=hunter2:': kept whole",
                "quoted 'postgres://me@db/x?password=***': kept whole",
            ),
        ] {
            let got = text(raw);
            assert_eq!(got, shown, "{raw}");
            assert!(!got.contains("secret") && !got.contains("hunter2"), "{got}");
        }
        let raw = "postgres://me@db/x?password=hunter2";
        assert_eq!(
            scrub(&format!("connecting to {raw}: connection refused"), raw),
            "connecting to postgres://me@db/x?password=***: connection refused"
        );
    }
}
