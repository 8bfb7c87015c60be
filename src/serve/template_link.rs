//! `/l/TOKEN?u=URL`: a link the campaign's template wrote (see
//! `compose::template_links`). The URL is in the request, so the token
//! decides whether it may be followed: its MAC covers the message
//! (campaign, recipient, content version) and exactly this URL, made when
//! that message was rendered. A changed `u`, another message's token, or a
//! URL no render of ours produced gets one plain 404 and records nothing;
//! without exactly one `u` the request is a 400. Never an open redirect.
//! Clicks are recorded as `/c/`'s are (test messages' not at all).
//! Message-template mail's links (flow steps) come here too, every one,
//! with tokens of their own purpose naming the message.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State as Extract};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use percent_encoding::percent_decode_str;

use super::tracking::{not_found, record_click, record_message, redirect, MAX_TOKEN_LEN};
use super::State;
use crate::compose::safe_link;
use crate::compose::template_links::MAX_TRACKED_URL;
use crate::store::engagement::HitKind;
use crate::store::message_engagement::MessageHit;

/// `GET /l/TOKEN?u=URL`: a redirect to URL if the token was made for it.
pub async fn follow(
    Extract(state): Extract<State>,
    Path(token): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(url) = target(query.as_deref()) else {
        return bad_request();
    };
    if token.len() > MAX_TOKEN_LEN || url.len() > MAX_TRACKED_URL {
        return not_found();
    }
    let Some(m) = state.identity.signer.read_link(&token, &url) else {
        return message_click(&state, &token, &url).unwrap_or_else(not_found);
    };
    // Tokens are made only for web links that are their own canonical
    // form; anything else is refused even with a genuine token.
    let web = url.starts_with("http://") || url.starts_with("https://");
    let location = match HeaderValue::from_str(&url) {
        Ok(v) if web && safe_link(&url).as_deref() == Some(url.as_str()) => v,
        _ => return not_found(),
    };
    record_click(&state, m, HitKind::TemplateLink(Arc::from(url.as_str()))).await;
    redirect(location)
}

/// `/l/TOKEN?u=URL` of message-template mail (a flow step), or `None`:
/// not a message's link token for this URL. The token binds the message
/// and the exact URL, as a campaign's template link does.
fn message_click(state: &State, token: &str, url: &str) -> Option<Response> {
    let message = state.identity.signer.read_message_link(token, url)?;
    let web = url.starts_with("http://") || url.starts_with("https://");
    let location = match HeaderValue::from_str(url) {
        Ok(v) if web && safe_link(url).as_deref() == Some(url) => v,
        _ => return Some(not_found()),
    };
    record_message(state, message, MessageHit::Click(url.to_string()));
    Some(redirect(location))
}

/// The one `u` of the query, percent-decoded; `None` when there is none,
/// more than one, or it is not UTF-8. A `+` stays a `+`: our own links
/// encode every byte but letters and digits.
fn target(query: Option<&str>) -> Option<String> {
    let mut found = None;
    for pair in query?.split('&') {
        if let Some(value) = pair.strip_prefix("u=") {
            if found.is_some() {
                return None;
            }
            found = Some(percent_decode_str(value).decode_utf8().ok()?.into_owned());
        }
    }
    found
}

fn bad_request() -> Response {
    (
        StatusCode::BAD_REQUEST,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        "bad request\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn takes_exactly_one_u() {
        assert_eq!(
            target(Some("u=https%3A%2F%2Fa.test%2F%3Fx%3D1%26y%3D2")).as_deref(),
            Some("https://a.test/?x=1&y=2")
        );
        assert_eq!(target(Some("x=1&u=a+b")).as_deref(), Some("a+b"));
        assert_eq!(target(Some("u=a&u=b")), None);
        assert_eq!(target(Some("x=1")), None);
        assert_eq!(target(Some("u=%FF")), None);
        assert_eq!(target(None), None);
    }
}
