//! `/api/v1`: the HTTP API the shop's own application calls, on the admin
//! listener beside the dashboard (which keeps its `/api/campaigns`).
//!
//! - [`auth`]: the bearer key, its scopes ([`auth::Need`]) and its rate;
//!   [`keys`]: the keys themselves (`mailsplit apikey`).
//! - [`problem`]: every error is RFC 9457 `application/problem+json`,
//!   also axum's own rejections; bodies are capped at [`MAX_BODY`].
//! - [`subscribers`], [`campaigns`], [`messages`]: the routes, calling the same stage
//!   functions as the CLI (the import's writer, `campaign::create`, the
//!   splitter, `control`).
//! - [`openapi`]: `GET /api/v1/openapi.json`, generated from the handlers.
//!
//! ## Adding a route
//! 1. Write the handler in its area's file (or a new file, declared here):
//!    first argument `Need<Scope>` (e.g. `auth::Need<auth::Send>`), the
//!    body as [`Input<T>`] (never `axum::Json`, whose rejections are not
//!    problem details), result `Result<(StatusCode, Json<R>), Problem>`.
//!    Request and response types derive `serde` and `utoipa::ToSchema`.
//! 2. Put `#[utoipa::path(...)]` on it: method, path (from `/api/v1`),
//!    `tag`, `request_body`, every response with its schema (errors:
//!    `body = Problem, content_type = "application/problem+json"`), and
//!    `security(("bearer" = []))`.
//! 3. Register it in the area's `routes()` with `routes!(handler)`: the
//!    router and the OpenAPI document come from that one line, so they
//!    cannot drift. A new area's `routes()` is merged in [`router`].
//! 4. `scripts/api-conformance.sh` then fuzzes it with the rest.

pub mod auth;
pub mod campaigns;
pub mod keys;
pub mod messages;
pub mod openapi;
pub mod problem;
pub mod subscribers;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::middleware;
use axum::Router;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use utoipa_axum::router::OpenApiRouter;

use super::State;
use crate::store::{Conn, Db, Plans, StoreError};
pub use problem::Problem;

/// Largest request body (413 beyond).
pub const MAX_BODY: usize = 1024 * 1024;

/// What the API keeps between requests.
pub struct ApiState {
    /// The connections keys are checked and messages stored on: a few, so
    /// an application's submits do not queue on the dashboard's one
    /// connection, nor open a connection each.
    pub dbs: DbPool,
    /// Per key: requests left at once.
    pub buckets: auth::Buckets,
    /// Background enqueue runs (one blocking thread and one database
    /// connection each); beyond, 429.
    pub enqueues: Arc<Semaphore>,
}

impl ApiState {
    pub fn new(url: &str, rate: u32, burst: u32) -> ApiState {
        ApiState {
            dbs: DbPool::new(url, super::pool::API_CONNECTIONS),
            buckets: auth::Buckets::new(rate, burst),
            enqueues: Arc::new(Semaphore::new(super::pool::API_ENQUEUES)),
        }
    }
}

/// A few database handles (each one connection, opened when first used
/// and re-opened after a failure), lent one call at a time: a call waits
/// for a free one rather than taking a blocking thread to wait on it.
pub struct DbPool {
    idle: std::sync::Mutex<Vec<Arc<Db>>>,
    free: Semaphore,
}

impl DbPool {
    fn new(url: &str, n: usize) -> DbPool {
        let n = n.max(1);
        DbPool {
            idle: std::sync::Mutex::new(
                (0..n).map(|_| Db::new(url, None, Plans::Custom)).collect(),
            ),
            free: Semaphore::new(n),
        }
    }

    /// Run `f` on one of the connections.
    pub async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn) -> Result<T, StoreError> + Send + 'static,
    {
        let _permit = self
            .free
            .acquire()
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?;
        let lent = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        // A permit is only ever held with a handle out of `idle`.
        let Some(db) = lent else {
            return Err(StoreError::Task("no free API connection".into()));
        };
        let out = db.run(f).await;
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(db);
        out
    }
}

/// A JSON body whose rejections are problem details.
pub struct Input<T>(pub T);

impl<T, S> FromRequest<S> for Input<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Input(value)),
            Err(rejection) => Err(Problem::from(rejection as JsonRejection)),
        }
    }
}

/// Every route of the API and its OpenAPI document.
fn api() -> OpenApiRouter<State> {
    OpenApiRouter::with_openapi(openapi::base()).nest("/api/v1", versioned())
}

fn versioned() -> OpenApiRouter<State> {
    OpenApiRouter::new()
        .merge(subscribers::routes())
        .merge(campaigns::routes())
        .merge(messages::routes())
        .merge(openapi::routes())
}

/// The routes under `/api/v1`, to merge into the admin router (outside
/// its session gate: the API has its own, [`auth`]).
pub fn router() -> Router<State> {
    let (routes, doc) = api().split_for_parts();
    if let Err(e) = openapi::publish(&openapi::finish(doc)) {
        tracing::warn!(error = %e, "cannot encode the OpenAPI document");
    }
    routes
        .route("/api/v1/{*rest}", axum::routing::any(not_found))
        .layer(middleware::map_response(problem::as_problem))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

async fn not_found() -> Problem {
    Problem::not_found("no such route in /api/v1; see /api/v1/openapi.json")
}

/// The OpenAPI document as served (for tests and `docs/api.md`).
pub fn document() -> utoipa::openapi::OpenApi {
    let (_, doc) = api().split_for_parts();
    openapi::finish(doc)
}
