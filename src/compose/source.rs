//! Content as the user gives it, turned once (at `campaign create`) into
//! the templates workers render: Markdown to HTML (pulldown-cmark), the
//! `<style>` block's CSS inlined (css-inline; many mail clients drop
//! `<style>`), and a text part derived from the HTML when none was given
//! (html2text: paragraphs, line breaks, links as `text (url)`).
//!
//! The Jinja tags (`{{ … }}`, `{% … %}`, `{# … #}`) are set aside while a
//! converter runs and put back after, so no converter escapes the quotes
//! of `default("friend")` or moves a tag.

use html2text::render::TextDecorator;

/// Prefix and suffix of a stand-in for a Jinja tag: letters and digits
/// only, which no converter changes.
const MARK: (&str, &str) = ("MSJINJA", "Q");

/// The source with each Jinja tag replaced by a stand-in, and the tags.
/// Outside an HTML tag the stand-in is an HTML comment (allowed anywhere,
/// even between table rows, where an HTML parser would move text) when
/// `comments` is set; inside a tag (an attribute value) it is a word.
fn protect(source: &str, comments: bool) -> (String, Vec<String>) {
    let mut out = String::with_capacity(source.len());
    let mut tags = Vec::new();
    let mut in_tag = false;
    let mut quote: Option<char> = None;
    let mut rest = source;
    while let Some(c) = rest.chars().next() {
        let close = match rest.get(..2) {
            Some("{{") => Some("}}"),
            Some("{%") => Some("%}"),
            Some("{#") => Some("#}"),
            _ => None,
        };
        if let Some(end) = close.and_then(|close| rest[2..].find(close).map(|i| i + 4)) {
            let n = tags.len();
            tags.push(rest[..end].to_string());
            if comments && !in_tag {
                out.push_str(&format!("<!--{}{n}{}-->", MARK.0, MARK.1));
            } else {
                out.push_str(&format!("{}{n}{}", MARK.0, MARK.1));
            }
            rest = &rest[end..];
            continue;
        }
        match (in_tag, quote, c) {
            (false, _, '<') => {
                in_tag = rest[1..].starts_with(|n: char| n.is_ascii_alphabetic() || n == '/');
            }
            (true, None, '"' | '\'') => quote = Some(c),
            (true, Some(q), _) if q == c => quote = None,
            (true, None, '>') => in_tag = false,
            _ => {}
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    (out, tags)
}

/// Put the Jinja tags back (both stand-in forms).
fn restore(converted: &str, tags: &[String]) -> String {
    let mut out = converted.to_string();
    // Highest first, so MSJINJA1Q never matches inside MSJINJA11Q (the
    // closing Q prevents it anyway).
    for (n, tag) in tags.iter().enumerate().rev() {
        let word = format!("{}{n}{}", MARK.0, MARK.1);
        out = out.replace(&format!("<!--{word}-->"), tag);
        out = out.replace(&word, tag);
    }
    out
}

/// A Markdown template as an HTML template.
pub fn markdown_to_html(markdown: &str) -> String {
    let (protected, tags) = protect(markdown, false);
    let protected = statements_as_blocks(&protected, &tags);
    let parser = pulldown_cmark::Parser::new_ext(
        &protected,
        pulldown_cmark::Options::ENABLE_TABLES | pulldown_cmark::Options::ENABLE_STRIKETHROUGH,
    );
    let mut html = String::with_capacity(markdown.len() * 2);
    pulldown_cmark::html::push_html(&mut html, parser);
    restore(&html, &tags)
}

/// A line holding nothing but Jinja statements (`{% for … %}`,
/// `{% endif %}`, `{# … #}`) becomes HTML comments, which Markdown keeps
/// as a block of their own: as words they would open a paragraph that the
/// list or heading after them cuts (`<p>{% for %}</p><ul>…`), leaving a
/// `</p>` without its `<p>` in every iteration.
fn statements_as_blocks(protected: &str, tags: &[String]) -> String {
    let statement = |word: &str| {
        let n = word.strip_prefix(MARK.0)?.strip_suffix(MARK.1)?;
        let tag = tags.get(n.parse::<usize>().ok()?)?;
        (tag.starts_with("{%") || tag.starts_with("{#")).then_some(())
    };
    let mut out = String::with_capacity(protected.len() + 16 * tags.len());
    for line in protected.split_inclusive('\n') {
        let mut words = line.split_whitespace().peekable();
        let only_statements =
            words.peek().is_some() && line.split_whitespace().all(|w| statement(w).is_some());
        if only_statements {
            for word in words {
                out.push_str(&format!("<!--{word}-->"));
            }
            out.push('\n');
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Width the derived text part is wrapped at.
const TEXT_WIDTH: usize = 78;

/// A text template derived from an HTML template.
pub fn html_to_text(html: &str) -> Result<String, String> {
    let (protected, tags) = protect(html, false);
    let text = html2text::config::with_decorator(LinkDecorator::default())
        .string_from_read(protected.as_bytes(), TEXT_WIDTH)
        .map_err(|e| format!("cannot derive the text part from the HTML: {e}"))?;
    Ok(restore(text.trim_end(), &tags) + "\n")
}

/// The HTML template with the CSS of its `<style>` blocks inlined into
/// `style` attributes; as it was when it has none. Nothing is fetched:
/// remote stylesheets are not loaded.
pub fn inline_css(html: &str) -> Result<String, String> {
    if !html.to_ascii_lowercase().contains("<style") {
        return Ok(html.to_string());
    }
    let (protected, tags) = protect(html, true);
    let inliner = css_inline::CSSInliner::options()
        .load_remote_stylesheets(false)
        .build();
    let inlined = inliner
        .inline(&protected)
        .map_err(|e| format!("cannot inline the CSS of the <style> block: {e}"))?;
    Ok(restore(&inlined, &tags))
}

/// html2text's plain decorator, but links are written `text (url)`.
#[derive(Clone, Default)]
struct LinkDecorator {
    links: Vec<String>,
}

impl TextDecorator for LinkDecorator {
    type Annotation = ();

    fn decorate_link_start(&mut self, url: &str) -> (String, ()) {
        self.links.push(url.to_string());
        (String::new(), ())
    }
    fn decorate_link_end(&mut self) -> String {
        match self.links.pop() {
            Some(url) if !url.is_empty() && !url.starts_with('#') => format!(" ({url})"),
            _ => String::new(),
        }
    }
    fn decorate_em_start(&self) -> (String, ()) {
        (String::new(), ())
    }
    fn decorate_em_end(&self) -> String {
        String::new()
    }
    fn decorate_strong_start(&self) -> (String, ()) {
        (String::new(), ())
    }
    fn decorate_strong_end(&self) -> String {
        String::new()
    }
    fn decorate_strikeout_start(&self) -> (String, ()) {
        (String::new(), ())
    }
    fn decorate_strikeout_end(&self) -> String {
        String::new()
    }
    fn decorate_code_start(&self) -> (String, ()) {
        (String::new(), ())
    }
    fn decorate_code_end(&self) -> String {
        String::new()
    }
    fn decorate_preformat_first(&self) {}
    fn decorate_preformat_cont(&self) {}
    fn decorate_image(&mut self, _src: &str, title: &str) -> (String, ()) {
        (title.to_string(), ())
    }
    fn header_prefix(&self, _level: usize) -> String {
        String::new()
    }
    fn quote_prefix(&self) -> String {
        "> ".to_string()
    }
    fn unordered_item_prefix(&self) -> String {
        "* ".to_string()
    }
    fn ordered_item_prefix(&self, i: i64) -> String {
        format!("{i}. ")
    }
    fn make_subblock_decorator(&self) -> Self {
        LinkDecorator::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keeps_paragraphs_breaks_and_links_and_the_tags() {
        let html = "<html><head><style>p{color:red}</style></head><body>\
            <p>Hello {{ name | default(\"friend\") }},</p>\
            <p>line one<br>line two</p>\
            <p><a href=\"{{ unsubscribe_url }}\">Unsubscribe</a></p></body></html>";
        let text = html_to_text(html).unwrap();
        assert_eq!(
            text,
            "Hello {{ name | default(\"friend\") }},\n\nline one\nline two\n\n\
             Unsubscribe ({{ unsubscribe_url }})\n",
            "{text}"
        );
    }

    #[test]
    fn css_is_inlined_around_loops_in_tables() {
        let html = "<html><head><style>td{color:red}</style></head><body><table>\
            {% for i in range(2) %}<tr><td title=\"{{ i }}\">{{ i }}</td></tr>{% endfor %}\
            </table></body></html>";
        let out = inline_css(html).unwrap();
        assert!(out.contains("style=\"color: red;\""), "{out}");
        assert!(!out.contains("<style"), "{out}");
        // The loop stays around the row (the parser adds a <tbody>).
        let (open, row, end) = (out.find("{% for"), out.find("<tr>"), out.find("{% endfor"));
        assert!(open < row && row < end && open.is_some(), "{out}");
        assert!(out.contains("title=\"{{ i }}\""), "{out}");
    }

    #[test]
    fn markdown_keeps_jinja_quotes() {
        let html =
            markdown_to_html("# Hi {{ name | default(\"friend\") }}\n\n[shop](https://x.test)");
        assert!(
            html.contains("<h1>Hi {{ name | default(\"friend\") }}</h1>"),
            "{html}"
        );
        assert!(
            html.contains("<a href=\"https://x.test\">shop</a>"),
            "{html}"
        );
    }

    #[test]
    fn markdown_loops_around_list_items_make_whole_lists() {
        let html = markdown_to_html(
            "Our picks:\n\n{% for p in products %}\n- {{ p.name }}\n{% endfor %}\n\n{# note #}\nBye\n",
        );
        assert!(!html.contains("<p>{%"), "{html}");
        for (open, close) in [("<p>", "</p>"), ("<ul>", "</ul>"), ("<li>", "</li>")] {
            assert_eq!(
                html.matches(open).count(),
                html.matches(close).count(),
                "{open}: {html}"
            );
        }
        let mut env = minijinja::Environment::new();
        env.add_template("t", &html).unwrap();
        let products = [
            minijinja::context! {name => "Mug"},
            minijinja::context! {name => "Tea"},
        ];
        let out = env
            .get_template("t")
            .unwrap()
            .render(minijinja::context! {products})
            .unwrap();
        assert!(
            out.contains("<li>Mug</li>") && out.contains("<li>Tea</li>"),
            "{out}"
        );
        assert!(!out.contains("<p></p>") && !out.contains("note"), "{out}");
        assert!(out.contains("<p>Bye</p>"), "{out}");
    }
}
