//! Admin routes: the operator's view and controls. Every request must carry
//! `Authorization: Bearer <MAILSPLIT_ADMIN_TOKEN>`, checked in constant time
//! by [`require_token`]; without a configured token `serve` binds this
//! listener to loopback only (see `config::ServeSettings`). GET never
//! changes anything.

use axum::extract::{Request, State as Extract};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use super::State;
use crate::status::CampaignStatus;
use crate::store::campaigns;

pub fn router(state: State) -> Router {
    Router::new()
        .route("/api/campaigns", get(api_campaigns))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

/// Refuse any request without the admin token (when one is configured).
async fn require_token(Extract(state): Extract<State>, req: Request, next: Next) -> Response {
    let Some(expected) = state.settings.admin_token.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "admin token required\n",
        )
            .into_response()
    }
}

/// Equality that takes as long whatever the position of the first
/// difference (the length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Every campaign as `status --json` prints it.
async fn api_campaigns(Extract(state): Extract<State>) -> Response {
    match state.db.run(campaigns::list).await {
        Ok(rows) => Json(
            rows.iter()
                .map(|(c, counters)| CampaignStatus::new(c, counters))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read campaigns");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response()
        }
    }
}
