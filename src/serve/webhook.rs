//! `POST /webhooks/bounce` on the public listener: bounces and complaints
//! that a provider reports by HTTP instead of by mail. The body is JSON,
//! `{"email": "…"}` or `{"token": "<VERP token>"}` (which also names the
//! campaign), `"type": "hard" | "soft" | "complaint"` and an optional
//! `"reason"` and the provider's event `"id"`; each call is one event,
//! handled as `mailsplit bounce` handles a report (the same actions, the
//! same once-only recording: a provider retrying the same event records
//! nothing new). An event is known again by its `"id"` when it has one,
//! else by its parsed fields (see [`event_fingerprint`]), never by the raw
//! bytes: a replay that differs only in whitespace or key order is the
//! same event.
//!
//! Every request needs `Authorization: Bearer $MAILSPLIT_WEBHOOK_TOKEN`,
//! compared in constant time; without a configured token the route does
//! not exist at all (404), so a public listener never takes unauthenticated
//! writes.

use std::net::IpAddr;

use axum::body::Bytes;

use axum::extract::{DefaultBodyLimit, State as Extract};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

use super::cookie::constant_time_eq;
use super::guard::{Client, Credential};
use super::State;
use crate::bounce;
use crate::store::bounces::{self, BounceKind, BounceSource, NewBounce};
use crate::store::{campaigns, recipients, StoreError};

/// Largest body accepted: one event is a few hundred bytes.
const MAX_BODY: usize = 64 << 10;

/// The webhook route, or none when no token is configured.
pub fn router(state: State) -> Router<State> {
    if state.settings.webhook_token.is_none() {
        return Router::new();
    }
    Router::new()
        .route("/webhooks/bounce", post(receive))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Event {
    email: Option<String>,
    token: Option<String>,
    #[serde(rename = "type")]
    kind: String,
    reason: Option<String>,
    /// The provider's id of the event, when it gives one.
    id: Option<String>,
}

/// What names an event across retries: the provider's id when given, else
/// its fields after parsing (the address as a mailbox key, the token in
/// lower case, the reason with its whitespace collapsed).
fn event_fingerprint(event: &Event) -> String {
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(id) = event.id.as_deref().map(str::trim).filter(|i| !i.is_empty()) {
        return format!("webhook:id:{}", bounce::fingerprint(id.as_bytes()));
    }
    let email = event
        .email
        .as_deref()
        .map(|e| crate::mailbox::key(e.trim()).unwrap_or_else(|_| e.trim().to_lowercase()));
    let canonical = serde_json::json!([
        email,
        event
            .token
            .as_deref()
            .map(|t| t.trim().to_ascii_lowercase()),
        event.kind.trim(),
        event.reason.as_deref().map(words),
    ]);
    format!(
        "webhook:{}",
        bounce::fingerprint(canonical.to_string().as_bytes())
    )
}

fn answer(code: StatusCode, message: &str) -> Response {
    (code, Json(serde_json::json!({ "error": message }))).into_response()
}

/// The answer that refuses the request, unless its bearer token is the
/// configured webhook token; failures count toward the client's lock-out
/// as a login's do.
fn refusal(state: &State, client: IpAddr, headers: &HeaderMap) -> Option<Response> {
    let expected = state.settings.webhook_token.as_deref().unwrap_or_default();
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if expected.is_empty() || !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        if let Some(wait) = state.failures.blocked(client, Credential::Webhook, given) {
            return Some(super::guard::too_many(client, "webhook", wait));
        }
        state
            .failures
            .failed(client, Credential::Webhook, "webhook bearer header", given);
        return Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "webhook token required\n",
            )
                .into_response(),
        );
    }
    None
}

/// The event and its kind, or the status and sentence that say what is
/// wrong with it.
fn parsed(body: &[u8]) -> Result<(Event, BounceKind), (StatusCode, String)> {
    let event: Event = match serde_json::from_slice(body) {
        Ok(e) => e,
        Err(e) => return Err((StatusCode::BAD_REQUEST, format!("bad JSON: {e}"))),
    };
    let kind = match event.kind.trim() {
        "hard" => BounceKind::Hard,
        "soft" => BounceKind::Soft,
        "complaint" => BounceKind::Complaint,
        _ => {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                "\"type\" must be \"hard\", \"soft\" or \"complaint\"".into(),
            ))
        }
    };
    if event.email.is_none() && event.token.is_none() {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "give \"email\" or \"token\" (the VERP token)".into(),
        ));
    }
    Ok((event, kind))
}

async fn receive(
    Extract(state): Extract<State>,
    Client(client): Client,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = refusal(&state, client, &headers) {
        return refused;
    }
    let (event, kind) = match parsed(&body) {
        Ok(parsed) => parsed,
        Err((status, why)) => return answer(status, &why),
    };
    let fingerprint = event_fingerprint(&event);
    let identity = state.identity.clone();
    let result = state
        .public
        .db(move |conn| record(conn, &identity, &event, kind, &fingerprint))
        .await;
    match result {
        Ok(Some(json)) => Json(json).into_response(),
        Ok(None) => answer(StatusCode::NOT_FOUND, "no such recipient"),
        Err(e) => {
            tracing::warn!(error = %e, "webhook: cannot record the event");
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable; retry",
            )
        }
    }
}

/// Find the recipient and record the event; `None` when nobody matches.
fn record(
    conn: &mut crate::store::Conn,
    identity: &crate::tokens::Identity,
    event: &Event,
    kind: BounceKind,
    fingerprint: &str,
) -> Result<Option<serde_json::Value>, StoreError> {
    let (recipient_id, email, campaign_id) = match (&event.token, &event.email) {
        (Some(token), _) => {
            let ids = if token.contains('@') {
                bounce::read_verp(identity, token)
            } else {
                identity.signer.read_verp(token)
            };
            let Some((campaign, recipient)) = ids else {
                return Ok(None);
            };
            let Some(r) = recipients::load(conn, &[recipient])?.pop() else {
                return Ok(None);
            };
            (r.id, r.email, campaigns::get(conn, campaign)?.map(|c| c.id))
        }
        (None, Some(email)) => match bounces::find_recipient(conn, email)? {
            Some((id, email)) => (id, email, None),
            None => return Ok(None),
        },
        (None, None) => return Ok(None),
    };
    let reason = event.reason.as_deref().unwrap_or("reported by webhook");
    let done = bounces::record(
        conn,
        &NewBounce {
            recipient_id,
            campaign_id,
            email: &email,
            kind,
            status: None,
            reason,
            source: BounceSource::Webhook,
            fingerprint,
        },
        &bounce::action_for(kind, None, reason, "webhook", &bounce::Settings::default()),
    )?;
    Ok(Some(serde_json::json!({
        "recipient": email,
        "campaign": campaign_id,
        "type": kind.as_str(),
        "recorded": done.new,
        "status": done.changed_to.map(|s| s.as_str()),
    })))
}
