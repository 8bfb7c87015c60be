//! The built-in confirmation mail of a double-opt-in sign-up. A message
//! template named [`USER_TEMPLATE`] (`mailsplit template create confirm
//! …`) wins; without one, the sign-up is mailed with the built-in
//! content shipped in the binary (`templates/confirm/`), kept in the
//! message templates under the reserved name [`BUILTIN_TEMPLATE`] so the
//! workers send it like any other message (ledger, DKIM, suppressions,
//! webhooks). That row belongs to mailsplit: it is rewritten whenever the
//! shipped content or the sender changes, so edits go in `confirm`.
//!
//! The templates see `data.confirm_url`, `data.lists` (the lists' titles)
//! and `data.name` (what the form gave, maybe empty).

use crate::store::message_templates::{self as stored, Content, Stream};
use crate::store::{Conn, StoreError};

/// The user's own confirmation template, which overrides the built-in one.
pub const USER_TEMPLATE: &str = "confirm";
/// The name the built-in confirmation template is stored under.
pub const BUILTIN_TEMPLATE: &str = "mailsplit.confirm";

/// The built-in subject.
pub const SUBJECT: &str = "Please confirm your subscription";
/// The built-in HTML part (minijinja, as a message template's).
pub const HTML: &str = include_str!("../../templates/confirm/confirm.html");
/// The built-in text part.
pub const TEXT: &str = include_str!("../../templates/confirm/confirm.txt");

/// The sender of the built-in mail when `MAILSPLIT_CONFIRM_FROM` is not
/// set: `no-reply@` the public URL's host (`localhost` for an IP address).
pub fn default_from(public_url: &str) -> String {
    let host = url::Url::parse(public_url)
        .ok()
        .and_then(|u| match u.host() {
            Some(url::Host::Domain(d)) => Some(d.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| "localhost".to_string());
    format!("no-reply@{host}")
}

/// The message template a confirmation goes out with: the user's
/// `confirm` if there is one, else the built-in one from `from`, stored
/// (or brought up to date) first.
pub fn template(conn: &mut Conn, from: &str) -> Result<&'static str, StoreError> {
    if stored::find(conn, USER_TEMPLATE)?.is_some() {
        return Ok(USER_TEMPLATE);
    }
    let content = Content {
        stream: Stream::Transactional,
        subject: SUBJECT,
        from_addr: from,
        html: HTML,
        text: TEXT,
        // A confirmation that bounces names nobody worth keeping.
        return_path: None,
        // A confirmation link is followed once; nothing to track.
        track: "",
        public_url: None,
    };
    match stored::find(conn, BUILTIN_TEMPLATE)? {
        None => {
            // A concurrent sign-up may create it first: either row is this one.
            stored::create(conn, BUILTIN_TEMPLATE, &content)?;
        }
        Some(t)
            if t.subject != SUBJECT
                || t.from_addr != from
                || t.html != HTML
                || t.text_body != TEXT
                || t.stream != Stream::Transactional =>
        {
            stored::edit(conn, BUILTIN_TEMPLATE, &content)?;
        }
        Some(_) => {}
    }
    Ok(BUILTIN_TEMPLATE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compose::content::{Compiled, Sources, Vars};
    use crate::compose::message::MESSAGE_VARIABLES;
    use serde_json::json;

    fn render(lists: &[&str], name: &str) -> (String, String) {
        let compiled = Compiled::with_vars(
            &Sources {
                subject: ("subject", SUBJECT),
                body: Some([("HTML part", HTML), ("text part", TEXT)]),
            },
            BUILTIN_TEMPLATE,
            MESSAGE_VARIABLES,
        )
        .expect("the built-in confirmation mail compiles");
        let mut vars = Vars::new(
            "",
            "a@example.com",
            &Default::default(),
            "",
            BUILTIN_TEMPLATE,
        );
        vars.data = Some(json!({
            "confirm_url": "https://x.test/confirm/T0K&N",
            "lists": lists,
            "name": name,
        }));
        let (_, room) = compiled.subject(&vars).expect("subject renders");
        compiled
            .body(&vars, room)
            .expect("body renders")
            .expect("a body")
    }

    #[test]
    fn builtin_mail_names_the_link_and_every_list() {
        let (html, text) = render(&["Weekly <news>", "Offers"], "Ann");
        assert!(
            html.contains("href=\"https:&#x2f;&#x2f;x.test&#x2f;confirm&#x2f;T0K&amp;N\""),
            "{html}"
        );
        assert!(
            html.contains("Weekly &lt;news&gt;") && html.contains("Offers"),
            "{html}"
        );
        assert!(html.contains("Hello Ann"), "{html}");
        assert!(text.contains("https://x.test/confirm/T0K&N"), "{text}");
        assert!(
            text.contains("  - Weekly <news>") && text.contains("  - Offers"),
            "{text}"
        );
        let (html, text) = render(&["Weekly"], "");
        assert!(html.contains("the list <strong>Weekly</strong>"), "{html}");
        assert!(text.starts_with("Hello,"), "{text}");
    }

    #[test]
    fn default_sender_is_on_the_public_host() {
        assert_eq!(
            default_from("https://news.example.com"),
            "no-reply@news.example.com"
        );
        assert_eq!(default_from("http://127.0.0.1:8080"), "no-reply@localhost");
    }
}
