//! Links a template writes (`<a href="{{ p.url }}">` in a product loop,
//! `href="{{ base }}/p/{{ p.id }}"`), tracked at render time.
//!
//! Once per content version, each `href` of an `<a>` or `<area>` in the
//! HTML part whose value holds a Jinja tag is wrapped in
//! `{% filter __mailsplit_track %}…{% endfilter %}`; the templates are
//! compiled once as before, so nothing is parsed per message. Per message
//! the worker derives one key ([`crate::tokens::MessageLinks`], one HMAC);
//! the filter then takes each rendered URL and, if it is an `http(s)` link
//! that [`super::safe_link`] accepts and not one of our own routes, writes
//! `BASE/l/TOKEN?u=URL` instead, TOKEN binding the message and that exact
//! URL (one HMAC per link). `serve` redirects only where a genuine token
//! says, so a changed `u`, another message's token or a URL this render
//! never produced is refused: no open redirect. Anything else (`mailto:`,
//! a `javascript:` URL from a recipient's attribute, our own
//! `unsubscribe_url`) is written as it was rendered, untracked.

use std::sync::Arc;

use minijinja::value::{Object, Value};
use minijinja::{Error, State};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::html_scan::{anchor_values, decode_entities, has_jinja, own_routes, Edit};
use crate::tokens::MessageLinks;

/// The filter the rewritten HTML wraps template-written links in.
pub const TRACK_FILTER: &str = "__mailsplit_track";
/// The variable holding one message's [`LinkMaker`].
pub const LINKER_VAR: &str = "__mailsplit_linker";
/// Longer rendered URLs are left untracked: the click URL carries the URL
/// whole, and a stored URL is a key of the report's table.
pub const MAX_TRACKED_URL: usize = 2_000;

/// The edits that wrap every template-written `href` of `html` in the
/// tracking filter. A value that cannot stand alone as a template (a
/// block opened in one attribute and closed elsewhere) is left alone, so
/// the rewrite never breaks a version that compiled before.
pub(super) fn wrap_hrefs(html: &str) -> Vec<Edit> {
    let mut edits = Vec::new();
    for v in anchor_values(html) {
        let value = &html[v.start..v.end];
        if !has_jinja(value) || is_unsubscribe(value) {
            continue;
        }
        let wrapped = format!("{{% filter {TRACK_FILTER} %}}{value}{{% endfilter %}}");
        if minijinja::Environment::new()
            .template_from_str(&wrapped)
            .is_err()
        {
            continue;
        }
        edits.push(Edit {
            start: v.start,
            end: v.end,
            with: wrapped,
        });
    }
    edits
}

/// `{{ unsubscribe_url }}` (with filters or not): ours, never wrapped (the
/// filter would also leave it, as a link to our own `/u/` route).
fn is_unsubscribe(value: &str) -> bool {
    let inner = value
        .trim()
        .strip_prefix("{{")
        .and_then(|v| v.strip_suffix("}}"))
        .map(|v| v.trim_matches(|c: char| c.is_whitespace() || c == '-'));
    inner.is_some_and(|v| {
        v.strip_prefix("unsubscribe_url")
            .is_some_and(|rest| rest.is_empty() || rest.trim_start().starts_with('|'))
    })
}

/// One message's maker of click URLs for the links its template writes.
pub struct LinkMaker {
    /// The public URL, without a trailing `/`.
    base: String,
    own: Vec<String>,
    links: MessageLinks,
}

impl std::fmt::Debug for LinkMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkMaker(<redacted>)")
    }
}

impl Object for LinkMaker {
    /// Never written into a message, whatever names it.
    fn render(self: &Arc<Self>, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

impl LinkMaker {
    pub fn new(base: &str, links: MessageLinks) -> LinkMaker {
        LinkMaker {
            base: base.trim_end_matches('/').to_string(),
            own: own_routes(base),
            links,
        }
    }

    /// The click URL standing for `rendered` (an attribute value as the
    /// HTML part wrote it, entities and all), or `None`: it stays as is.
    pub fn click_url(&self, rendered: &str) -> Option<String> {
        let url = super::safe_link(&decode_entities(rendered.trim()))?;
        let lower = url.to_ascii_lowercase();
        let web = lower.starts_with("http://") || lower.starts_with("https://");
        if !web || url.len() > MAX_TRACKED_URL || self.own.iter().any(|o| lower.starts_with(o)) {
            return None;
        }
        let token = self.links.token(&url);
        let encoded = utf8_percent_encode(&url, NON_ALPHANUMERIC);
        Some(format!("{}/l/{token}?u={encoded}", self.base))
    }
}

/// The tracking filter: the click URL of a rendered link, or the link as
/// it was rendered (no [`LinkMaker`]: a trial render, or a version that
/// does not track clicks).
pub fn track(state: &State, value: Value) -> Result<Value, Error> {
    let Some(maker) = state.lookup(LINKER_VAR) else {
        return Ok(value);
    };
    let (Some(maker), Some(rendered)) = (maker.downcast_object_ref::<LinkMaker>(), value.as_str())
    else {
        return Ok(value);
    };
    Ok(match maker.click_url(rendered) {
        // Percent-encoded but for the base: only `&` needs escaping.
        Some(url) => Value::from_safe_string(url.replace('&', "&amp;")),
        None => value,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tracking::{rewrite, Links};
    use super::*;
    use crate::store::content::Track;
    use crate::tokens::{Signer, Tracked};

    const CLICKS: Track = Track {
        opens: false,
        clicks: true,
    };

    #[test]
    fn wraps_template_written_hrefs_only() {
        let html = "{% for p in attributes.products %}<a href=\"{{ p.url }}\">x</a>\
                    <area href='{{ base }}/p/{{ p.id }}'>{% endfor %}\
                    <a href=\"{{ unsubscribe_url }}\">u</a><a href=\"https://shop.test/\">s</a>\
                    <a href=\"{% if x %}a\">broken</a>";
        let (h, _) = rewrite(html, "", CLICKS, "https://m.test", &mut Links::new());
        assert!(
            h.contains("href=\"{% filter __mailsplit_track %}{{ p.url }}{% endfilter %}\""),
            "{h}"
        );
        assert!(h.contains(
            "href='{% filter __mailsplit_track %}{{ base }}/p/{{ p.id }}{% endfilter %}'"
        ));
        assert!(h.contains("href=\"{{ unsubscribe_url }}\""), "{h}");
        assert!(
            h.contains("href=\"{{ __mailsplit_links[0]|safe }}\""),
            "{h}"
        );
        assert!(h.contains("href=\"{% if x %}a\""), "{h}");
    }

    #[test]
    fn click_urls_only_for_web_links_elsewhere() {
        let s = Signer::new(&[1u8; 32]);
        let m = Tracked {
            campaign: 1,
            recipient: 2,
            version: 1,
        };
        let maker = LinkMaker::new("https://m.test/", s.message_links(m));
        let url = maker.click_url("https://shop.test/p?a=1&amp;b=2").unwrap();
        let (head, u) = url.split_once("?u=").unwrap();
        assert_eq!(u, "https%3A%2F%2Fshop%2Etest%2Fp%3Fa%3D1%26b%3D2");
        let token = head.strip_prefix("https://m.test/l/").unwrap();
        assert_eq!(s.read_link(token, "https://shop.test/p?a=1&b=2"), Some(m));
        for left in [
            "javascript:alert(1)",
            "java&#9;script:alert(1)",
            "mailto:a@b.test",
            "/relative",
            "https://m.test/u/abc",
            "HTTPS://M.TEST/l/abc?u=x",
        ] {
            assert_eq!(maker.click_url(left), None, "{left}");
        }
        let long = format!("https://shop.test/{}", "a".repeat(MAX_TRACKED_URL));
        assert_eq!(maker.click_url(&long), None);
    }

    #[test]
    fn a_rendered_message_carries_click_urls_for_its_own_links() {
        use super::super::content::{Compiled, Sources, Vars};
        let html = "{% for p in attributes.products %}<a href=\"{{ p.url }}\">{{ p.name }}</a>\
                    {% endfor %}<a href=\"{{ unsubscribe_url }}\">u</a>";
        let (h, t) = rewrite(html, "", CLICKS, "https://m.test", &mut Links::new());
        let sources = Sources {
            subject: ("subject", "s"),
            body: Some([("html", h.as_str()), ("text", t.as_str())]),
        };
        let compiled = Compiled::tracked(&sources, "c", 0).unwrap();
        let attrs: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"products":[{"url":"https://shop.test/p/1?x=1&y=2","name":"A"},
                            {"url":"javascript:alert(1)","name":"B"}]}"#,
        )
        .unwrap();
        let mut vars = Vars::new("n", "e@x.test", &attrs, "https://m.test/u/tok", "c");
        let s = Signer::new(&[1u8; 32]);
        let m = Tracked {
            campaign: 1,
            recipient: 2,
            version: 1,
        };
        vars.linker = Some(Value::from_object(LinkMaker::new(
            "https://m.test",
            s.message_links(m),
        )));
        let (_, room) = compiled.subject(&vars).unwrap();
        let (html, _) = compiled.body(&vars, room).unwrap().unwrap();
        let start = html.find("https://m.test/l/").expect(&html) + "https://m.test/l/".len();
        let (token, rest) = html[start..].split_once("?u=").unwrap();
        assert!(rest.starts_with("https%3A%2F%2Fshop%2Etest%2Fp%2F1%3Fx%3D1%26y%3D2\">A</a>"));
        assert_eq!(s.read_link(token, "https://shop.test/p/1?x=1&y=2"), Some(m));
        assert!(
            html.contains("href=\"javascript:alert(1)\">B</a>"),
            "{html}"
        );
        assert!(html.contains("&#x2f;u&#x2f;tok\">u</a>"), "{html}");
        assert_eq!(html.matches("/l/").count(), 1, "{html}");
        // Without a maker (a trial render) every link is as rendered.
        vars.linker = None;
        let (html, _) = compiled.body(&vars, room).unwrap().unwrap();
        assert!(html.contains("p&#x2f;1?x=1&amp;y=2\">A"), "{html}");
        assert!(!html.contains("/l/"), "{html}");
    }
}
