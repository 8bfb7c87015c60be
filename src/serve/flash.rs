//! Notes for the page a form redirects to (a new campaign's warnings on
//! its page): a cookie scoped to that page's path, read and cleared by
//! the first visit. Its value is MACed under the admin key with the path
//! it was made for, so neither another site nor a copied cookie can put
//! words on an admin page; the notes are escaped where they are shown.

use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::Response;
use data_encoding::BASE64URL_NOPAD;
use hmac::Mac;

use super::cookie::{cookie_value, mac};
use super::State;

/// Name of the cookie.
const COOKIE: &str = "mailsplit_flash";

/// What the MAC is made under, beside the path.
const LABEL: &str = "mailsplit admin flash";

/// How long a note waits for its page (seconds).
const TTL_SECS: u64 = 300;

/// Most bytes of notes a cookie carries: browsers keep about 4 KB per
/// cookie, and the value is base64 (4/3) plus its MAC.
const MOST: usize = 2_400;

/// `response`, leaving `notes` for the next visit of `path`; nothing when
/// there are none. Notes past [`MOST`] bytes are cut, and the last kept
/// says how many were left out.
pub fn leave(state: &State, mut response: Response, path: &str, notes: &[String]) -> Response {
    if notes.is_empty() {
        return response;
    }
    let kept = fitting(notes);
    let payload =
        BASE64URL_NOPAD.encode(serde_json::to_string(&kept).unwrap_or_default().as_bytes());
    let tag = BASE64URL_NOPAD.encode(
        &mac(state, LABEL, &signed(path, &payload))
            .finalize()
            .into_bytes(),
    );
    let cookie = format!(
        "{COOKIE}={payload}.{tag}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={TTL_SECS}"
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

/// The notes left for `path`, if the request carries valid ones.
pub fn read(state: &State, headers: &HeaderMap, path: &str) -> Vec<String> {
    let Some((payload, tag)) = cookie_value(headers, COOKIE).and_then(|v| v.split_once('.')) else {
        return Vec::new();
    };
    let Ok(tag) = BASE64URL_NOPAD.decode(tag.as_bytes()) else {
        return Vec::new();
    };
    if mac(state, LABEL, &signed(path, payload))
        .verify_slice(&tag)
        .is_err()
    {
        return Vec::new();
    }
    BASE64URL_NOPAD
        .decode(payload.as_bytes())
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .unwrap_or_default()
}

/// `response`, clearing the notes of `path` when the request had any
/// (shown once).
pub fn clear(mut response: Response, headers: &HeaderMap, path: &str) -> Response {
    if cookie_value(headers, COOKIE).is_some() {
        let cookie = format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    response
}

fn signed(path: &str, payload: &str) -> String {
    format!("{path}\0{payload}")
}

/// The first notes that fit in [`MOST`] bytes, and a count of the rest.
fn fitting(notes: &[String]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut used = 0;
    for n in notes {
        if used + n.len() > MOST {
            kept.push(format!(
                "… and {} more (the API's `warnings` lists them all)",
                notes.len() - kept.len()
            ));
            break;
        }
        used += n.len();
        kept.push(n.clone());
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::fitting;

    #[test]
    fn notes_past_the_cookies_room_are_counted_not_kept() {
        let many: Vec<String> = (0..40).map(|i| format!("{i:>99}")).collect();
        let kept = fitting(&many);
        assert_eq!(kept.len(), 25);
        assert_eq!(
            kept.last().map(String::as_str),
            Some("… and 16 more (the API's `warnings` lists them all)")
        );
        assert_eq!(fitting(&many[..3]), many[..3].to_vec());
    }
}
