//! Secrets never reach a message, a log line or a banner: every URL that
//! may hold a password (SMTP relay, database) is shown through [`url`]
//! first, also when it does not parse.

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

/// `raw` with the password of its user-info and the values of secret query
/// parameters replaced by [`HIDDEN`]. Works on text, not on a parsed URL,
/// so a URL too broken to parse is hidden the same way: everything between
/// the first `:` after `scheme://` and the last `@` of the authority goes.
pub fn url(raw: &str) -> String {
    let (scheme, rest) = match raw.find("://") {
        Some(k) => raw.split_at(k + 3),
        None => ("", raw),
    };
    // The authority ends at the first '/', '?' or '#' after the last '@'
    // (a password may itself hold '/', '?' or '#' when it is not encoded).
    let at = rest.rfind('@');
    let authority_end = {
        let from = at.map_or(0, |k| k + 1);
        rest[from..]
            .find(['/', '?', '#'])
            .map_or(rest.len(), |k| from + k)
    };
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match (scheme.is_empty(), authority.rfind('@')) {
        (false, Some(k)) => {
            let (userinfo, host) = authority.split_at(k);
            match userinfo.find(':') {
                Some(colon) => format!("{}:{HIDDEN}{host}", &userinfo[..colon]),
                None => authority.to_string(),
            }
        }
        _ => authority.to_string(),
    };
    format!("{scheme}{authority}{}", query(tail))
}

/// Hide the values of secret query parameters in `tail` (path, query,
/// fragment).
fn query(tail: &str) -> String {
    let Some((path, q)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let (q, fragment) = match q.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (q, None),
    };
    let pairs: Vec<String> = q
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()) => {
                format!("{k}={HIDDEN}")
            }
            _ => pair.to_string(),
        })
        .collect();
    let mut out = format!("{path}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::url;

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
}
