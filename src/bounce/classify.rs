//! What a failure says about the address: by the enhanced status code
//! (RFC 3463) first, by the words of the diagnostic only when there is no
//! specific code. Policy blocks (x.7.x: spam filters, blocklists,
//! authentication) are kept apart from bad addresses: they say who sent the
//! message was refused, not that the mailbox is gone.

use crate::mail::Enhanced;
use crate::store::bounces::BounceKind;

/// The first enhanced status code anywhere in `text` (`5.1.1`, `#4.4.1`,
/// `550-5.2.1`, `(5.7.1)`), skipping things that only look like one (IP
/// addresses, version numbers).
pub fn enhanced_in(text: &str) -> Option<Enhanced> {
    text.split(|c: char| {
        c.is_whitespace() || matches!(c, '(' | ')' | '[' | ']' | '<' | '>' | ';' | ',')
    })
    .filter_map(|word| {
        // `550-5.2.1` (a multi-line reply's continuation) and `#4.4.1`.
        let word = word.rsplit(['-', '#']).next().unwrap_or(word);
        let word = word.trim_end_matches(['.', ':']);
        let code = Enhanced::parse(word)?;
        // Three parts exactly, each short: not 192.0.2.1, not 1.2.3.4.5.
        (word.split('.').count() == 3 && code.class != 2).then_some(code)
    })
    .next()
}

/// An enhanced code worth more than a generic one: `x.0.0` says nothing
/// beyond success or failure.
pub fn is_specific(code: Enhanced) -> bool {
    !(code.subject == 0 && code.detail == 0)
}

/// The kind of a failed delivery with this code.
pub fn by_code(code: Enhanced) -> Option<BounceKind> {
    use BounceKind::{Hard, Policy, Soft};
    Some(match (code.class, code.subject, code.detail) {
        (4 | 5, 7, _) => Policy,
        // Media and content: the message, not the address.
        (4 | 5, 6, _) => Policy,
        // Bad sender addresses (5.1.7, 5.1.8): about us, not them.
        (_, 1, 7 | 8) => Policy,
        (5, 1, _) => Hard,
        // Disabled account; a full mailbox may empty again.
        (5, 2, 1) => Hard,
        (5, 2, _) => Soft,
        // No such domain: unroutable, or Microsoft's DNS failures.
        (5, 4, 4 | 310 | 312) => Hard,
        (5, 0, 0) => return None,
        (5, _, _) => Soft,
        (4, _, _) => Soft,
        _ => return None,
    })
}

/// Phrases of hard failures, for reports without a specific code.
const HARD_WORDS: &[&str] = &[
    "user unknown",
    "unknown user",
    "no such user",
    "no such mailbox",
    "no such recipient",
    "mailbox not found",
    "mailbox unavailable",
    "does not exist",
    "unknown recipient",
    "recipient not found",
    "recipientnotfound",
    "recipnotfound",
    "invalid recipient",
    "invalid mailbox",
    "not recognized",
    "illegal alias",
    "no mx record",
    "host or domain name not found",
    "domain not found",
    "host unknown",
    "unrouteable address",
    "account disabled",
    "account has been disabled",
    "is disabled",
];
const SOFT_WORDS: &[&str] = &[
    "mailbox full",
    "mailbox is full",
    "over quota",
    "quota exceeded",
    "insufficient storage",
    "timed out",
    "connection refused",
    "could not establish",
    "try again",
    "temporar",
];
const POLICY_WORDS: &[&str] = &[
    "spam",
    "blocked",
    "blacklist",
    "blocklist",
    "reverse dns",
    "dmarc",
    "relay access denied",
    "reputation",
    "policy",
];

/// The kind the words of a diagnostic suggest, if any.
pub fn by_words(text: &str) -> Option<BounceKind> {
    let text = text.to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(HARD_WORDS) {
        Some(BounceKind::Hard)
    } else if has(SOFT_WORDS) {
        Some(BounceKind::Soft)
    } else if has(POLICY_WORDS) {
        Some(BounceKind::Policy)
    } else {
        None
    }
}

/// The kind and code of a failure (the reporting MTA gave up) from its
/// status code and diagnostic text: a specific code in the diagnostic wins
/// over a generic status (`Status: 5.0.0` with `550 5.7.1 …`), words decide
/// only where no code does, and a permanent failure nothing explains is
/// hard.
pub fn failure(status: Option<Enhanced>, diagnostic: &str) -> (BounceKind, Option<Enhanced>) {
    let in_text = enhanced_in(diagnostic);
    let code = match (status, in_text) {
        (Some(s), Some(t)) if !is_specific(s) && is_specific(t) && s.class == t.class => Some(t),
        (Some(s), _) => Some(s),
        (None, t) => t,
    };
    let kind = code
        .and_then(by_code)
        .or_else(|| by_words(diagnostic))
        .unwrap_or(match code {
            Some(c) if c.class == 4 => BounceKind::Soft,
            _ => BounceKind::Hard,
        });
    (kind, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(s: &str) -> Enhanced {
        Enhanced::parse(s).unwrap()
    }

    #[test]
    fn codes_in_text() {
        assert_eq!(enhanced_in("550 5.1.1 <a@b>: no"), Some(code("5.1.1")));
        assert_eq!(
            enhanced_in("could not connect (#4.4.1)"),
            Some(code("4.4.1"))
        );
        assert_eq!(
            enhanced_in("550-5.2.1 The email account"),
            Some(code("5.2.1"))
        );
        assert_eq!(enhanced_in("host 192.0.2.1 said 550"), None);
        assert_eq!(enhanced_in("2.0.0 ok"), None);
    }

    #[test]
    fn kinds() {
        use BounceKind::*;
        let k = |s: &str, d: &str| failure(Enhanced::parse(s), d).0;
        assert_eq!(k("5.1.1", ""), Hard);
        assert_eq!(k("5.1.10", ""), Hard);
        assert_eq!(k("5.4.4", ""), Hard);
        assert_eq!(k("5.2.2", "Quota exceeded"), Soft);
        assert_eq!(k("5.2.1", "disabled"), Hard);
        assert_eq!(k("4.4.1", ""), Soft);
        assert_eq!(k("4.7.0", "deferred due to complaints"), Policy);
        assert_eq!(k("5.7.1", "user unknown"), Policy);
        // A generic status refined by the diagnostic's code or words.
        assert_eq!(k("5.0.0", "550 5.7.1 Fix reverse DNS"), Policy);
        assert_eq!(k("5.0.0", "550 : User unknown"), Hard);
        assert_eq!(k("5.0.0", "550 go away"), Hard);
        assert_eq!(failure(None, "Mailbox Full").0, Soft);
        assert_eq!(failure(None, "No mx record found for domain").0, Hard);
    }
}
