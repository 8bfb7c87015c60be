//! The headers large mailbox providers require of bulk mail (Gmail's and
//! Yahoo's 2024 sender rules, Outlook's since 2025), each built by one
//! function: `Message-ID` on the From domain, `List-Id` (RFC 2919),
//! `Feedback-ID` (Gmail's feedback loop), `List-Unsubscribe` (RFC 2369) and
//! `List-Unsubscribe-Post` (RFC 8058 one-click). Also the one check every
//! link a template renders goes through ([`safe_link`]).
//!
//! Every value built here is ASCII without CR or LF: names and URLs pass
//! through [`label`], [`safe_link`] or [`super::fold`] (RFC 2047 encoding,
//! folded within RFC 5322's line limits) first, so nothing a list name or a
//! CSV attribute holds can add a header or make a line over 998 octets.

use lettre::message::header::{HeaderName, HeaderValue};

/// Longest label taken from a campaign or list name (Feedback-ID, List-Id).
const MAX_LABEL: usize = 40;

/// Whether `link` may be rendered into a message as a link: an `http(s)`
/// URL with a host, or a `mailto:` URL. Returns it as it must be written
/// (parsed and re-serialised: percent-encoded, no blanks, quotes or angle
/// brackets), or `None` (`javascript:`, `data:`, relative links, …).
pub fn safe_link(link: &str) -> Option<String> {
    if link.chars().any(char::is_control) {
        return None;
    }
    let url = url::Url::parse(link.trim()).ok()?;
    let ok = match url.scheme() {
        "http" | "https" => url.host_str().is_some_and(|h| !h.is_empty()),
        "mailto" => url.path().contains('@'),
        _ => false,
    };
    ok.then(|| url.as_str().to_string())
}

/// The campaign's one-click unsubscribe link for one token.
pub fn unsubscribe_link(public_url: &str, token: &str) -> String {
    format!("{}/u/{token}", public_url.trim_end_matches('/'))
}

/// `<TOKEN.DATABASE@DOMAIN>`: one id per message, the same on every retry
/// of it (a receiver that got it twice can tell), distinct across
/// installations sending from one domain, on the From domain as Gmail
/// wants. TOKEN (see [`crate::tokens::Signer::message_id_token`]) names
/// campaign and recipient under an HMAC, so a report quoting the id can be
/// believed, and nobody can make up the id of another recipient's message.
pub fn message_id(token: &str, database_id: &str, domain: &str) -> String {
    format!("<{token}.{}@{domain}>", label(database_id))
}

/// `List-Id: "NAME" <LABEL.DOMAIN>` (RFC 2919): the list's name as the
/// description (folded, encoded only where needed), a label made of it
/// under the From domain as the id.
pub fn list_id(list_name: &str, list: i64, domain: &str) -> HeaderValue {
    let mut id = label(list_name).to_ascii_lowercase();
    id = id.trim_matches(['-', '.']).to_string();
    while id.contains("..") {
        id = id.replace("..", ".");
    }
    if id.is_empty() {
        id = format!("list-{list}");
    }
    super::fold::phrase_then("List-Id", list_name, &format!("<{id}.{domain}>"))
}

/// `Feedback-ID: CAMPAIGN:LIST:TEMPLATE:SENDER` in Gmail's format: the
/// campaign, list and template on the left, so complaint rates can be told
/// apart; the installation's id on the right, stable across campaigns.
pub fn feedback_id(campaign: &str, list: &str, template: &str, sender: &str) -> HeaderValue {
    let value = [campaign, list, template, sender]
        .iter()
        .map(|part| label(part))
        .collect::<Vec<_>>()
        .join(":");
    raw("Feedback-ID", value)
}

/// `List-Unsubscribe: <LINK>`, and with a one-click link also
/// `List-Unsubscribe-Post: List-Unsubscribe=One-Click` (RFC 8058: the link
/// answers a POST by unsubscribing, no login, no further page).
pub fn list_unsubscribe(link: &str, one_click: bool) -> Vec<HeaderValue> {
    let mut out = vec![raw("List-Unsubscribe", format!("<{link}>"))];
    if one_click {
        out.push(raw(
            "List-Unsubscribe-Post",
            "List-Unsubscribe=One-Click".to_string(),
        ));
    }
    out
}

/// A header of ASCII text, folded by lettre where it has blanks.
fn raw(name: &'static str, value: String) -> HeaderValue {
    HeaderValue::new(HeaderName::new_from_ascii_str(name), value)
}

/// `text` with every character but letters, digits, `.`, `_` and `-`
/// turned into `-`, at most [`MAX_LABEL`] long: safe inside a header token
/// (no colon, blank or angle bracket).
fn label(text: &str) -> String {
    let out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL)
        .collect();
    if out.is_empty() {
        "-".into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::dns_name;

    #[test]
    fn only_http_and_mailto_links_pass() {
        for good in [
            "https://example.com/u/1",
            "http://example.com",
            "mailto:leave@example.com?subject=unsubscribe",
        ] {
            assert!(safe_link(good).is_some(), "{good}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript:alert(1)",
            " javascript:alert(1)",
            "data:text/html,<script>",
            "vbscript:x",
            "/relative",
            "//evil.example/x",
            "https://",
            "mailto:",
            "file:///etc/passwd",
            "https://a.example/\r\nBcc: x@y",
            "",
        ] {
            assert_eq!(safe_link(bad), None, "{bad}");
        }
        // What a header or an attribute could be broken with is encoded.
        let odd = safe_link("https://example.com/a b\"<x>").unwrap();
        assert!(!odd.contains([' ', '"', '<', '>']), "{odd}");
    }

    #[test]
    fn domains_become_a_labels() {
        assert_eq!(dns_name("Exämple.COM").unwrap(), "xn--exmple-cua.com");
        assert_eq!(dns_name("bücher.de").unwrap(), "xn--bcher-kva.de");
        assert_eq!(dns_name("example.test").unwrap(), "example.test");
        assert_eq!(dns_name("not a domain"), None);
        assert_eq!(dns_name("127.0.0.1"), None);
    }

    fn encoded(h: &HeaderValue) -> String {
        let mut headers = lettre::message::header::Headers::new();
        headers.insert_raw(h.clone());
        headers.to_string()
    }

    #[test]
    fn list_and_feedback_ids_are_tokens_whatever_the_names() {
        let h = encoded(&list_id("Kunden: Ü \"VIP\"\r\nBcc: x", 7, "example.com"));
        assert!(h.is_ascii(), "{h}");
        // Folded perhaps, but one header: every line break but the last
        // continues it.
        let breaks = h.matches("\r\n").count();
        assert_eq!(h.matches("\r\n ").count() + 1, breaks, "{h}");
        assert!(h.contains("<kunden-----vip---bcc--x.example.com>"), "{h}");
        let plain = encoded(&list_id("customers", 3, "example.com"));
        assert_eq!(plain, "List-Id: \"customers\" <customers.example.com>\r\n");
        assert!(encoded(&list_id("???", 3, "example.com")).contains("<list-3.example.com>"));
        let f = encoded(&feedback_id(
            "spring sale",
            "custom:ers",
            "newsletter",
            "db-1",
        ));
        assert_eq!(f, "Feedback-ID: spring-sale:custom-ers:newsletter:db-1\r\n");
    }
}
