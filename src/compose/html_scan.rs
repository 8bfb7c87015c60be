//! Reading a template's HTML and text as they are written, without
//! rendering them: the `href`s of `<a>` and `<area>` (entities decoded),
//! scripts, where Jinja tags are, the end of the body, and edits applied
//! by byte range. Tracking rewrites a content version with these, and
//! `campaign create` checks its links with them; this file imports nothing
//! else of `compose`.

/// The public URL's routes whose links are never rewritten.
pub(super) fn own_routes(public_url: &str) -> Vec<String> {
    let base = public_url.trim_end_matches('/');
    ["u", "o", "c", "l", "p", "v"]
        .iter()
        .map(|r| format!("{base}/{r}/").to_ascii_lowercase())
        .collect()
}

/// A replacement of `start..end` of a source.
pub(super) struct Edit {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) with: String,
}

pub(super) fn apply(source: &str, mut edits: Vec<Edit>) -> String {
    edits.sort_by_key(|e| e.start);
    let mut out = String::with_capacity(source.len() + 64 * edits.len());
    let mut at = 0;
    for e in edits {
        if e.start < at {
            continue;
        }
        out.push_str(&source[at..e.start]);
        out.push_str(&e.with);
        at = e.end;
    }
    out.push_str(&source[at..]);
    out
}

/// Byte ranges of the Jinja tags (`{{ }}`, `{% %}`, `{# #}`) of `source`.
pub(super) fn jinja_tags(source: &str) -> Vec<(usize, usize)> {
    let mut tags = Vec::new();
    let mut at = 0;
    while let Some(found) = source[at..].find('{') {
        let start = at + found;
        let close = match source.as_bytes().get(start + 1) {
            Some(b'{') => "}}",
            Some(b'%') => "%}",
            Some(b'#') => "#}",
            _ => {
                at = start + 1;
                continue;
            }
        };
        let end = source[start + 2..]
            .find(close)
            .map_or(source.len(), |e| start + 2 + e + 2);
        tags.push((start, end));
        at = end;
    }
    tags
}

pub(super) fn inside(tags: &[(usize, usize)], pos: usize) -> bool {
    let i = tags.partition_point(|&(start, _)| start <= pos);
    i > 0 && pos < tags[i - 1].1
}

pub(super) fn has_jinja(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// The literal `href` values of `<a>` and `<area>` tags (Jinja tags
/// outside, none inside), entities decoded, each with its byte offset:
/// what `campaign create` checks the links of (see [`refused_href`]).
pub fn literal_hrefs(html: &str) -> Vec<(usize, String)> {
    anchor_hrefs(html)
        .into_iter()
        .map(|v| (v.start, decode_entities(html[v.start..v.end].trim())))
        .collect()
}

/// Where the `href` of each `<a>` and `<area>` tag of literal HTML is:
/// tags inside a Jinja tag, and values holding one, are left out.
pub(super) fn anchor_hrefs(html: &str) -> Vec<Value> {
    let mut found = anchor_values(html);
    found.retain(|v| !has_jinja(&html[v.start..v.end]));
    found
}

/// Where the `href` of each `<a>` and `<area>` tag is, outside Jinja tags.
pub(super) fn anchor_values(html: &str) -> Vec<Value> {
    let tags = jinja_tags(html);
    let bytes = html.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(lt) = html[at..].find('<') {
        let start = at + lt;
        at = start + 1;
        if inside(&tags, start) {
            continue;
        }
        let name_end = html[at..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(html.len(), |e| at + e);
        let name = html[at..name_end].to_ascii_lowercase();
        if name != "a" && name != "area" {
            continue;
        }
        let Some(value) = href_value(bytes, name_end) else {
            continue;
        };
        at = value.end;
        found.push(value);
    }
    found
}

/// Why a link cannot go out, if it cannot: a script scheme (`javascript:`,
/// `vbscript:`, or `data:`, which can hold a page with scripts; mail
/// clients neutralise all three, and phishing filters count them), or a
/// control character, with which it is no valid `Location` for the
/// tracked redirect nor a link a client follows. Browsers drop tabs and
/// newlines inside a scheme (`java&#9;script:`), so the check does too.
pub fn refused_href(url: &str) -> Option<&'static str> {
    if url.chars().any(char::is_control) {
        return Some("it holds a control character once its character references are decoded, so it is no valid link (nor a Location a redirect could answer with)");
    }
    let scheme: String = url
        .trim_start()
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .take(12)
        .collect::<String>()
        .to_ascii_lowercase();
    ["javascript:", "vbscript:", "data:"]
        .iter()
        .any(|s| scheme.starts_with(s))
        .then_some("javascript:, vbscript: and data: links run code or hide a page; mail clients disable them and spam filters count them against the sender")
}

/// Scripts in literal HTML, with their byte offsets: `<script>` elements
/// and `on…=` event-handler attributes. Mail clients strip both, so they
/// only make a message look like an attack; `campaign create` warns.
pub fn scripts(html: &str) -> Vec<(usize, String)> {
    let tags = jinja_tags(html);
    let b = html.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(lt) = html[at..].find('<') {
        let start = at + lt;
        at = start + 1;
        if inside(&tags, start) || !b.get(at).is_some_and(u8::is_ascii_alphabetic) {
            continue;
        }
        let name_end = html[at..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(html.len(), |e| at + e);
        if html[at..name_end].eq_ignore_ascii_case("script") {
            found.push((start, "<script>".to_string()));
        }
        let mut i = name_end;
        let mut quote = None;
        while i < b.len() {
            let c = b[i];
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == b'"' || c == b'\'' => quote = Some(c),
                None if c == b'>' => break,
                None if b[i - 1].is_ascii_whitespace() && c.eq_ignore_ascii_case(&b'o') => {
                    let end = b[i..]
                        .iter()
                        .position(|c| !c.is_ascii_alphanumeric())
                        .map_or(b.len(), |e| i + e);
                    let word = &html[i..end];
                    if word.len() > 2
                        && word[..2].eq_ignore_ascii_case("on")
                        && html[end..].trim_start().starts_with('=')
                    {
                        found.push((i, word.to_ascii_lowercase()));
                    }
                    i = end;
                    continue;
                }
                None => {}
            }
            i += 1;
        }
        at = i;
    }
    found
}

/// Where an attribute value is: inside its quotes, and with them.
pub(super) struct Value {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) quoted_start: usize,
    pub(super) quoted_end: usize,
}

/// The `href` attribute value of the tag whose attributes start at `at`.
pub(super) fn href_value(b: &[u8], mut at: usize) -> Option<Value> {
    loop {
        while at < b.len() && b[at].is_ascii_whitespace() {
            at += 1;
        }
        if at >= b.len() || b[at] == b'>' || b[at] == b'<' {
            return None;
        }
        let name_start = at;
        while at < b.len() && !b" \t\r\n=>/".contains(&b[at]) {
            at += 1;
        }
        let is_href = b[name_start..at].eq_ignore_ascii_case(b"href");
        if at == name_start {
            at += 1; // a stray `/`
            continue;
        }
        while at < b.len() && b[at].is_ascii_whitespace() {
            at += 1;
        }
        if b.get(at) != Some(&b'=') {
            continue; // an attribute without a value
        }
        at += 1;
        while at < b.len() && b[at].is_ascii_whitespace() {
            at += 1;
        }
        let quoted_start = at;
        let (start, end, quoted_end) = match b.get(at) {
            Some(&q) if q == b'"' || q == b'\'' => {
                let end = at + 1 + b[at + 1..].iter().position(|&c| c == q)?;
                (at + 1, end, end + 1)
            }
            Some(_) => {
                let end = b[at..]
                    .iter()
                    .position(|c| c.is_ascii_whitespace() || *c == b'>')
                    .map_or(b.len(), |e| at + e);
                (at, end, end)
            }
            None => return None,
        };
        if is_href {
            return Some(Value {
                start,
                end,
                quoted_start,
                quoted_end,
            });
        }
        at = quoted_end;
    }
}

/// A URL in running text without the punctuation after it: `(see
/// https://x.test/a).` ends at `a`; a `)` the URL opened stays.
pub(super) fn trim_url(url: &str) -> &str {
    let mut url = url;
    loop {
        let Some(last) = url.chars().next_back() else {
            return url;
        };
        let unbalanced = last == ')' && url.matches('(').count() < url.matches(')').count();
        if ".,;:!?]".contains(last) || unbalanced {
            url = &url[..url.len() - 1];
        } else {
            return url;
        }
    }
}

/// Where the pixel goes: before the last literal `</body`, else the end.
pub(super) fn body_end(html: &str) -> usize {
    let tags = jinja_tags(html);
    let lower = html.to_ascii_lowercase();
    lower
        .rmatch_indices("</body")
        .map(|(i, _)| i)
        .find(|&i| !inside(&tags, i))
        .unwrap_or(html.len())
}

/// HTML character references in an attribute value decoded: numeric ones
/// (`&#x2f;`, `&#47;`) and the named ones templates and converters write
/// (`&amp;`, `&lt;`, `&gt;`, `&quot;`, `&apos;`, `&sol;`, `&colon;`).
pub fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let decoded = rest[1..]
            .find(';')
            .filter(|&semi| semi <= 10)
            .and_then(|semi| entity(&rest[1..1 + semi]).map(|c| (c, semi + 2)));
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

pub(super) fn entity(name: &str) -> Option<char> {
    if let Some(num) = name.strip_prefix('#') {
        let code = match num.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => num.parse().ok()?,
        };
        return char::from_u32(code);
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "sol" => '/',
        "colon" => ':',
        _ => return None,
    })
}
