//! `multipart/form-data` bodies (RFC 7578), as a browser sends a form
//! with a file input: the admin gate reads the CSRF field from them, the
//! campaign form its fields and the uploaded content. Bodies are already
//! bounded by the gate's limit, so they are parsed whole.

/// One part: its field name, the file's name when it is a file, and the
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub value: Vec<u8>,
}

/// The boundary of a `multipart/form-data` content type; `None` for any
/// other type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';').map(str::trim);
    if !params.next()?.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The parts of `body`; `None` when it is not well formed.
pub fn parse(boundary: &str, body: &[u8]) -> Option<Vec<Part>> {
    let delimiter = format!("--{boundary}").into_bytes();
    let mut rest = body.get(find(body, &delimiter)? + delimiter.len()..)?;
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let end = find(rest, &delimiter)?;
        let part = rest[..end].strip_suffix(b"\r\n")?;
        let split = find(part, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&part[..split]).ok()?;
        let (name, filename) = disposition(head)?;
        parts.push(Part {
            name,
            filename,
            value: part[split + 4..].to_vec(),
        });
        rest = &rest[end + delimiter.len()..];
    }
}

/// `name` and `filename` of a part's `Content-Disposition: form-data`.
fn disposition(head: &str) -> Option<(String, Option<String>)> {
    let line = head.split("\r\n").find(|l| {
        l.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
    })?;
    let (_, value) = line.split_once(':')?;
    let (mut name, mut filename) = (None, None);
    for p in value.split(';').map(str::trim) {
        let Some((k, v)) = p.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').to_string();
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    Some((name?, filename))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_browser_form_with_a_file() {
        let ct = "multipart/form-data; boundary=----WebKitFormBoundaryAbC";
        let b = boundary(ct).unwrap();
        assert_eq!(b, "----WebKitFormBoundaryAbC");
        let body = "------WebKitFormBoundaryAbC\r\n\
            Content-Disposition: form-data; name=\"csrf\"\r\n\r\n\
            tok\r\n\
            ------WebKitFormBoundaryAbC\r\n\
            Content-Disposition: form-data; name=\"upload\"; filename=\"news.md\"\r\n\
            Content-Type: text/markdown\r\n\r\n\
            # Hi\r\n\r\nthere\r\n\
            ------WebKitFormBoundaryAbC--\r\n";
        let parts = parse(&b, body.as_bytes()).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "csrf");
        assert_eq!(parts[0].value, b"tok");
        assert_eq!(parts[1].filename.as_deref(), Some("news.md"));
        assert_eq!(parts[1].value, b"# Hi\r\n\r\nthere");
        assert!(parse(&b, b"garbage").is_none());
        assert!(boundary("application/x-www-form-urlencoded").is_none());
    }
}
