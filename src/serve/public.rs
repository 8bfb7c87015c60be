//! Public routes: what a reverse proxy exposes at the campaigns' public
//! URL. Nothing here needs a login; everything a request can change is
//! authorised by a signed token in its path. GET never changes anything
//! (mail software and link scanners prefetch links).
//!
//! `/u/TOKEN` is the one-click unsubscribe of RFC 8058: a receiver's POST
//! (body `List-Unsubscribe=One-Click`, form-urlencoded or multipart) or
//! the button on the GET page unsubscribes the token's recipient and
//! answers 200 with a short page: no redirect, no cookie, no login, and
//! repeating it is harmless. The token is the whole authority, so the body
//! is not needed to act on it and is not read. A token that is not
//! genuine gets the same 404 whatever is wrong with it, and no page says
//! anything about the recipient.

use axum::extract::{Path, State as Extract};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::State;
use crate::store::engagement;

/// Longer paths are no token of ours (ours are about 22 characters).
const MAX_TOKEN_LEN: usize = 64;

pub fn router(state: State) -> Router {
    Router::new()
        .route("/healthz", get(super::health::healthz))
        .route("/u/{token}", get(unsubscribe_page).post(unsubscribe))
        .route("/o/{token}", get(super::tracking::open))
        .route("/c/{token}/{n}", get(super::tracking::click))
        .route("/l/{token}", get(super::template_link::follow))
        .merge(super::webhook::router(state.clone()))
        .merge(super::subscribe::router())
        .merge(super::pages::router())
        .with_state(state)
}

/// The campaign and recipient of a genuine token.
fn read_token(state: &State, token: &str) -> Option<(i64, i64)> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    state.identity.signer.read_unsubscribe(token)
}

/// GET: a page with a button that POSTs; changes nothing.
async fn unsubscribe_page(Extract(state): Extract<State>, Path(token): Path<String>) -> Response {
    if read_token(&state, &token).is_none() {
        return not_found();
    }
    page(
        StatusCode::OK,
        "Unsubscribe",
        "<p>Stop receiving these emails?</p>\n\
         <form method=\"post\">\n\
         <input type=\"hidden\" name=\"List-Unsubscribe\" value=\"One-Click\">\n\
         <button type=\"submit\">Unsubscribe</button>\n\
         </form>",
    )
}

/// POST: unsubscribe (idempotent), then say so.
async fn unsubscribe(Extract(state): Extract<State>, Path(token): Path<String>) -> Response {
    let Some((campaign, recipient)) = read_token(&state, &token) else {
        return not_found();
    };
    let reason = format!("one-click unsubscribe (campaign {campaign})");
    match state
        .public
        .db(move |c| engagement::unsubscribe(c, campaign, recipient, &reason))
        .await
    {
        Ok(status) => {
            let now = status.map_or("no such recipient", |s| s.as_str());
            tracing::info!(campaign, recipient, now, "one-click unsubscribe");
            page(
                StatusCode::OK,
                "Unsubscribed",
                "<p>You are unsubscribed and will receive no more of these emails.</p>",
            )
        }
        Err(e) => {
            tracing::warn!(campaign, recipient, error = %e, "cannot record an unsubscribe");
            let mut response = page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Please try again",
                "<p>Your request could not be recorded just now. Please try again in a few minutes.</p>",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            response
        }
    }
}

/// The one answer to every token that is not genuine.
fn not_found() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Link not valid",
        "<p>This unsubscribe link is not valid. Please use the link in the email you received.</p>",
    )
}

/// A small self-contained HTML page: nothing to load from elsewhere, not
/// cached, not indexed, no referrer (the token is in the URL).
fn page(status: StatusCode, title: &'static str, body: &'static str) -> Response {
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title>\n<style>body{{font-family:sans-serif;max-width:32em;margin:3em auto;padding:0 1em}}\
         button{{font-size:1em;padding:.5em 1.5em}}</style></head>\n\
         <body>\n<h1>{title}</h1>\n{body}\n</body>\n</html>\n"
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
            ),
            (header::HeaderName::from_static("x-robots-tag"), "noindex"),
        ],
        html,
    )
        .into_response()
}
