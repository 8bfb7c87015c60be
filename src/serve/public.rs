//! Public routes: what a reverse proxy exposes at the campaigns' public
//! URL. Nothing here needs a login; everything a request can change is
//! authorised by a signed token in its path. GET never changes anything
//! (mail software prefetches links).

use axum::routing::get;
use axum::Router;

use super::State;

pub fn router(state: State) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}
