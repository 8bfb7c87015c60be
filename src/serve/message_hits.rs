//! Opens and clicks of message-template mail (flow steps), on the same
//! routes as a campaign's: `/o/TOKEN` and `/l/TOKEN?u=URL`, whose tokens
//! are made under purposes of their own (see
//! [`crate::tokens::Signer::message_open_token`]), so one never reads as
//! the other. A link token binds the message and the exact URL its render
//! pointed at: a changed `u` or a made-up token gets the campaigns' 404.
//! The hit is written by a task of its own; the pixel or redirect does
//! not wait for the database.

use std::net::SocketAddr;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;

use super::tracking::{is_prefetch, not_found, pixel, redirect};
use super::State;
use crate::compose::safe_link;
use crate::store::message_engagement::{self, MessageHit};
use crate::store::now_ms;

/// `/o/TOKEN` for a message's pixel, or `None`: not a message token.
pub(super) fn open(
    state: &State,
    token: &str,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Option<Response> {
    let message = state.identity.signer.read_message_open(token)?;
    let proxy = is_prefetch(headers, peer.ip());
    record(state, message, MessageHit::Open { proxy });
    Some(pixel())
}

/// `/l/TOKEN?u=URL` for a message's link, or `None`: not a message token
/// for this URL.
pub(super) fn click(state: &State, token: &str, url: &str) -> Option<Response> {
    let message = state.identity.signer.read_message_link(token, url)?;
    let web = url.starts_with("http://") || url.starts_with("https://");
    let location = match HeaderValue::from_str(url) {
        Ok(v) if web && safe_link(url).as_deref() == Some(url) => v,
        _ => return Some(not_found()),
    };
    record(state, message, MessageHit::Click(url.to_string()));
    Some(redirect(location))
}

fn record(state: &State, message: i64, hit: MessageHit) {
    let state = State::clone(state);
    let at = now_ms();
    tokio::spawn(async move {
        let done = state
            .public
            .db(move |c| message_engagement::record(c, message, &hit, at))
            .await;
        if let Err(e) = done {
            tracing::warn!(message, error = %e, "a message's open or click is not recorded");
        }
    });
}
