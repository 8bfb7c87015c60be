//! Open and click tracking, put into a content version's
//! templates once, never searched for per message.
//!
//! When a version tracks clicks, every literal `http(s)` link of its HTML
//! part (the `href` of `<a>` and `<area>`, entities decoded) and every
//! literal `http(s)` URL of its text part becomes the Jinja expression
//! `{{ __mailsplit_links[N-1] }}`, N the link's number in the version's own
//! link table (stored in `campaign_links` when the version is stored).
//! When it tracks opens, `<img src="{{ __mailsplit_open }}">` goes before
//! `</body>` (or at the end). The rewritten templates are compiled once per
//! version per process like any other; per message only the tokens are
//! made (one HMAC per link), so a tracked message costs a few microseconds
//! more. Left alone: `mailto:` and every other scheme, and links to the
//! public URL's own `/u/`, `/o/`, `/c/` and `/l/` routes. Links a template
//! expression writes into an `href` (`{{ p.url }}`: they differ per
//! recipient, so they have no number) are tracked at render time instead
//! (see [`super::template_links`]); in the text part they stay as written.

use std::collections::HashMap;

use super::content::{Compiled, Sources, TemplateProblem};
use super::html_scan::{
    anchor_hrefs, apply, body_end, decode_entities, inside, jinja_tags, own_routes, trim_url, Edit,
};
use super::tracking_urls::TrackingUrls;
pub use super::tracking_urls::{MessageUrls, LINKS_VAR, OPEN_VAR};
use crate::store::content::{self as stored, Content, ContentKind, Track};
use crate::store::{Campaign, Conn, StoreError};

/// A content version's link table: numbers given in order of first
/// appearance (HTML first, then text) when it is made, or the stored one.
#[derive(Debug, Default)]
pub struct Links {
    urls: Vec<String>,
    index: HashMap<String, usize>,
    /// Stored: a URL not in it is left alone (a later binary finding one
    /// more link than the one that stored the table numbers nothing).
    frozen: bool,
}

impl Links {
    /// An empty table that numbers every new link.
    pub fn new() -> Links {
        Links::default()
    }

    /// The stored table of a version, link 1 first.
    pub fn stored(urls: Vec<String>) -> Links {
        let index = urls
            .iter()
            .enumerate()
            .map(|(i, u)| (u.clone(), i))
            .collect();
        Links {
            urls,
            index,
            frozen: true,
        }
    }

    /// The 0-based index of `url`, numbering it if new and allowed.
    fn number(&mut self, url: &str) -> Option<usize> {
        if let Some(&i) = self.index.get(url) {
            return Some(i);
        }
        if self.frozen {
            return None;
        }
        self.urls.push(url.to_string());
        self.index.insert(url.to_string(), self.urls.len() - 1);
        Some(self.urls.len() - 1)
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    pub fn into_urls(self) -> Vec<String> {
        self.urls
    }
}

/// `html` and `text` with tracking put in as `track` asks; links are
/// numbered in `links`. `public_url`'s own routes are never rewritten.
pub fn rewrite(
    html: &str,
    text: &str,
    track: Track,
    public_url: &str,
    links: &mut Links,
) -> (String, String) {
    let own = own_routes(public_url);
    let mut html_edits = Vec::new();
    let mut text_edits = Vec::new();
    if track.clicks {
        html_edits = html_links(html, &own, links);
        html_edits.extend(super::template_links::wrap_hrefs(html));
        text_edits = text_links(text, &own, links);
    }
    if track.opens {
        let at = body_end(html);
        let pixel = format!(
            "<img src=\"{{{{ {OPEN_VAR}|safe }}}}\" width=\"1\" height=\"1\" alt=\"\" \
             style=\"display:block;width:1px;height:1px;border:0\">"
        );
        html_edits.push(Edit {
            start: at,
            end: at,
            with: pixel,
        });
    }
    (apply(html, html_edits), apply(text, text_edits))
}

/// The stored link table of `content` when it tracks clicks (read once
/// per version per process, when it is compiled).
pub fn stored_links(
    conn: &mut Conn,
    campaign: &Campaign,
    content: &Content,
) -> Result<Vec<String>, StoreError> {
    if Track::from_column(&content.track).clicks && campaign.public_url.is_some() {
        stored::links(conn, campaign.id, content.version)
    } else {
        Ok(Vec::new())
    }
}

/// The HTML and text templates of a content version before tracking: its
/// own, or a built-in starter's Jinja source when it tracks (the starters
/// render what the built-in templates do); `None`: the built-in template.
pub fn body_sources<'a>(
    kind: ContentKind,
    label: &str,
    parts: (&'a str, &'a str),
    track: Track,
) -> Option<(&'a str, &'a str)> {
    match kind {
        ContentKind::Builtin if track.any() => crate::templates::starter(label).ok(),
        ContentKind::Builtin => None,
        _ => Some(parts),
    }
}

/// Compile a stored content version (checked when it was stored), with
/// tracking put in when it tracks and the campaign has a public URL.
pub fn compile_stored(
    s: &Content,
    c: &Campaign,
    links: Vec<String>,
) -> Result<Compiled, TemplateProblem> {
    let campaign = c.name.as_str();
    let subject = ("subject", s.subject.as_str());
    let track = Track::from_column(&s.track);
    let body = body_sources(s.kind, &c.template, (&s.html, &s.text), track);
    let (Some(base), Some((html, text)), true) = (c.public_url.as_deref(), body, track.any())
    else {
        let body = body.map(|(h, t)| [("HTML part", h), ("text part", t)]);
        return Compiled::new(&Sources { subject, body }, campaign);
    };
    let mut table = Links::stored(links);
    let (html, text) = rewrite(html, text, track, base, &mut table);
    let body = Some([("HTML part", html.as_str()), ("text part", text.as_str())]);
    let count = table.urls().len();
    let mut compiled = Compiled::tracked(&Sources { subject, body }, campaign, count)?;
    compiled.tracking = Some(TrackingUrls {
        base: base.trim_end_matches('/').to_string(),
        version: s.version,
        opens: track.opens,
        links: count,
        clicks: track.clicks,
        targets: Vec::new(),
    });
    Ok(compiled)
}

/// Whether a link is tracked: http(s), and not one of our own routes.
fn trackable(url: &str, own: &[String]) -> bool {
    let lower = url.to_ascii_lowercase();
    (lower.starts_with("http://") || lower.starts_with("https://"))
        && !own.iter().any(|o| lower.starts_with(o.as_str()))
}

fn link_expr(i: usize) -> String {
    format!("{{{{ {LINKS_VAR}[{i}]|safe }}}}")
}

/// The `href` values of `<a>` and `<area>` tags in literal HTML.
fn html_links(html: &str, own: &[String], links: &mut Links) -> Vec<Edit> {
    let mut edits = Vec::new();
    for value in anchor_hrefs(html) {
        let url = decode_entities(html[value.start..value.end].trim());
        if !trackable(&url, own) {
            continue;
        }
        if let Some(i) = links.number(&url) {
            edits.push(Edit {
                start: value.quoted_start,
                end: value.quoted_end,
                with: format!("\"{}\"", link_expr(i)),
            });
        }
    }
    edits
}

/// The http(s) URLs written literally in a text part.
fn text_links(text: &str, own: &[String], links: &mut Links) -> Vec<Edit> {
    let tags = jinja_tags(text);
    let lower = text.to_ascii_lowercase();
    let mut edits = Vec::new();
    let mut at = 0;
    while let Some(found) = lower[at..].find("http") {
        let start = at + found;
        at = start + 4;
        let rest = &lower[start..];
        if !(rest.starts_with("http://") || rest.starts_with("https://")) || inside(&tags, start) {
            continue;
        }
        // Not the tail of a longer word (`xhttp://`).
        if lower[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric())
        {
            continue;
        }
        let end = text[start..]
            .find(|c: char| c.is_whitespace() || "<>\"'{}".contains(c))
            .map_or(text.len(), |e| start + e);
        at = end;
        if ["{{", "{%", "{#"]
            .iter()
            .any(|o| text[end..].starts_with(o))
        {
            continue; // `https://x/{{ id }}`: differs per recipient
        }
        let url = trim_url(&text[start..end]);
        if !trackable(url, own) {
            continue;
        }
        if let Some(i) = links.number(url) {
            edits.push(Edit {
                start,
                end: start + url.len(),
                with: link_expr(i),
            });
        }
    }
    edits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compose::html_scan::{literal_hrefs, refused_href, scripts};

    const ALL: Track = Track {
        opens: true,
        clicks: true,
    };

    #[test]
    fn rewrites_literal_links_only() {
        let html = "<html><body><a class=x href=\"https://shop.test/a?b=1&amp;c=2\">A</a>\
                    <A HREF='http://shop.test/b'>B</A> <a href=\"mailto:x@y.test\">m</a>\
                    <a href=\"{{ unsubscribe_url }}\">u</a><a href=\"https://m.test/u/tok\">u2</a>\
                    <link href=\"https://fonts.test/css\"><a href=\"https://x.test/{{ email }}\">d</a>\
                    <a href=\"https&#x3a;&#x2f;&#x2f;shop.test&#x2f;b\">again</a></body></html>";
        let text = "See https://shop.test/a?b=1&c=2, or (https://shop.test/c). \
                    {{ unsubscribe_url }} https://m.test/u/tok https://x.test/{{ email }}";
        let mut links = Links::new();
        let (h, t) = rewrite(html, text, ALL, "https://m.test", &mut links);
        assert_eq!(
            links.urls(),
            [
                "https://shop.test/a?b=1&c=2",
                "http://shop.test/b",
                "https://shop.test/b",
                "https://shop.test/c"
            ]
        );
        assert!(
            h.contains("<a class=x href=\"{{ __mailsplit_links[0]|safe }}\">A</a>"),
            "{h}"
        );
        assert!(
            h.contains("<A HREF=\"{{ __mailsplit_links[1]|safe }}\">B</A>"),
            "{h}"
        );
        assert!(h.contains("href=\"mailto:x@y.test\""), "{h}");
        assert!(h.contains("href=\"{{ unsubscribe_url }}\""), "{h}");
        assert!(h.contains("href=\"https://m.test/u/tok\""), "{h}");
        assert!(h.contains("<link href=\"https://fonts.test/css\">"), "{h}");
        // Written by the template: tracked at render time instead.
        assert!(
            h.contains(
                "href=\"{% filter __mailsplit_track %}https://x.test/{{ email }}{% endfilter %}\""
            ),
            "{h}"
        );
        assert!(h.ends_with("height:1px;border:0\"></body></html>"), "{h}");
        assert_eq!(
            t,
            "See {{ __mailsplit_links[0]|safe }}, or ({{ __mailsplit_links[3]|safe }}). \
             {{ unsubscribe_url }} https://m.test/u/tok https://x.test/{{ email }}"
        );
        // The stored table numbers the same links the same way, and no more.
        let mut stored = Links::stored(vec!["https://shop.test/c".into()]);
        let (h2, t2) = rewrite(html, text, ALL, "https://m.test", &mut stored);
        assert!(!h2.contains("__mailsplit_links"), "{h2}");
        assert!(t2.contains("({{ __mailsplit_links[0]|safe }})"), "{t2}");
    }

    #[test]
    fn opens_only_adds_a_pixel_and_no_links() {
        let mut links = Links::new();
        let (h, t) = rewrite(
            "<p><a href=\"https://a.test\">a</a></p>",
            "https://a.test",
            Track {
                opens: true,
                clicks: false,
            },
            "https://m.test",
            &mut links,
        );
        assert!(links.urls().is_empty());
        assert!(h.starts_with(
            "<p><a href=\"https://a.test\">a</a></p><img src=\"{{ __mailsplit_open|safe }}\""
        ));
        assert_eq!(t, "https://a.test");
    }

    #[test]
    fn finds_script_links_control_characters_and_handlers() {
        let html = "<a href=\"https://x.test\">ok</a>\n<a href=\"JavaScript:alert(1)\">j</a>\
                    <a href='java&#9;script:x'>t</a><area href=\"data:text/html,x\">\
                    <a href=\"https://x.test/&#10;\">c</a><a href=\"{{ attributes.url }}\">v</a>\
                    <a href=\"mailto:a@x.test\">m</a>";
        let refused: Vec<String> = literal_hrefs(html)
            .into_iter()
            .filter(|(_, url)| refused_href(url).is_some())
            .map(|(_, url)| url)
            .collect();
        assert_eq!(
            refused,
            [
                "JavaScript:alert(1)",
                "java\tscript:x",
                "data:text/html,x",
                "https://x.test/\n"
            ]
        );
        let html = "<p onclick=\"x()\" title=\"on=1 onload=2\">a</p><SCRIPT>x</SCRIPT>\
                    <img src=x\nOnError = 'y'><p>one=two</p>{{ '<script>' }}";
        let found: Vec<String> = scripts(html).into_iter().map(|(_, w)| w).collect();
        assert_eq!(found, ["onclick", "<script>", "onerror"]);
    }

    #[test]
    fn decodes_entities() {
        assert_eq!(
            decode_entities("https:&#x2f;&#47;a&amp;b&bogus;&"),
            "https://a&b&bogus;&"
        );
    }
}
