//! Admin routes: the operator's view and controls, behind [`auth`]'s gate
//! (bearer token or login session; CSRF proof on every POST). GET never
//! changes anything.
//!
//! | route | what |
//! |---|---|
//! | `GET /` , `GET /live` | the [`dashboard`] and its live part |
//! | `GET /campaigns/ID` | one campaign: content, versions, schedule ([`campaign_page`]) |
//! | `GET /campaigns/new`, `POST /campaigns/new` | the new-campaign form ([`campaign_form`](super::campaign_form)) |
//! | `POST /campaigns/NAME/send\|test`, `GET`/`POST /campaigns/NAME/edit` | the campaign page's forms ([`campaign_actions`](super::campaign_actions)) |
//! | `POST /campaigns/NAME/archive\|unarchive`, `GET /campaigns/archived` | archived campaigns ([`campaign_archive`](super::campaign_archive)) |
//! | `GET /flows`, `GET /flows/NAME`, `POST /flows/NAME/pause\|resume` | the flows, one flow's report and its Pause / Resume ([`flow_page`](super::flow_page)) |
//! | `GET\|POST /apikeys`, `/webhooks`, `/suppression` and their actions | the management pages ([`manage`](super::manage)) |
//! | `GET /subscribers`, `GET /subscribers/EMAIL`, `POST …/unsubscribe\|remove\|forget` | subscriber search, one person, their actions ([`people`](super::people)) |
//! | `GET /login`, `POST /login`, `POST /logout` | the session cookie |
//! | `POST /campaigns/NAME/ACTION` | the dashboard's buttons (303 back) |
//! | `GET /api/campaigns` | the objects of `status --json` |
//! | `POST /api/campaigns/NAME/pause\|resume\|cancel` | what the CLI does, as JSON |
//! | `GET /api/workers` | the fleet, as `workers --json` plus totals |
//! | `GET /metrics` | Prometheus/OpenMetrics text, see [`metrics`] |
//! | `/api/v1/…` | the application's API, see [`api`](super::api) |

use axum::extract::{Path, State as Extract};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::actions::{parse_action, run_control};
use super::guard::Client;
use super::{auth, campaign_page, dashboard, metrics, snapshot, State};
use crate::campaign::status::CampaignStatus;
use crate::store::campaigns;
use crate::store::{now_ms, workers, Conn, StoreError};
use crate::worker::fleet;

pub fn router(state: State) -> Router {
    Router::new()
        .route("/", get(dashboard::page))
        .route("/live", get(dashboard::live))
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/logout", post(auth::logout))
        .route("/static/dashboard.css", get(dashboard::stylesheet))
        .route("/static/dashboard.js", get(dashboard::script))
        .route("/campaigns/{name}/{action}", post(dashboard::control))
        .route("/api/campaigns", get(api_campaigns))
        .route("/api/campaigns/{name}/{action}", post(api_control))
        .route("/api/workers", get(api_workers))
        .route("/metrics", get(get_metrics))
        .merge(campaign_page::routes())
        .merge(super::campaign_form::routes())
        .merge(super::campaign_actions::routes())
        .merge(super::campaign_archive::routes())
        .merge(super::flow_page::routes())
        .merge(super::manage::routes())
        .merge(super::people::routes())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_admin,
        ))
        // After the gate: `/api/v1` checks its own keys.
        .merge(super::api::router())
        .with_state(state)
}

fn unavailable(e: &StoreError) -> Response {
    tracing::warn!(error = %e, "cannot read the database");
    (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response()
}

/// Every campaign as `status --json` prints it.
async fn api_campaigns(Extract(state): Extract<State>) -> Response {
    let all = |c: &mut Conn| {
        let rows = campaigns::list(c)?;
        crate::campaign::status::with_versions(c, &rows)
    };
    match state.admin.db(all).await {
        Ok(all) => Json(all).into_response(),
        Err(e) => unavailable(&e),
    }
}

/// The fleet: every worker as `workers --json` prints it, and the totals.
async fn api_workers(Extract(state): Extract<State>) -> Response {
    match state.admin.db(workers::list).await {
        Ok(rows) => Json(fleet::view(rows, now_ms())).into_response(),
        Err(e) => unavailable(&e),
    }
}

/// `GET /metrics`.
async fn get_metrics(Extract(state): Extract<State>) -> Response {
    let snapshot = match snapshot::take(&state).await {
        Ok(s) => s,
        Err(e) => return unavailable(&e),
    };
    match metrics::encode(snapshot) {
        Ok(text) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

/// `POST /api/campaigns/NAME/ACTION`: the campaign as `status --json`
/// shows it afterwards, and after a resume how many delayed jobs each
/// beanstalkd server made ready again.
async fn api_control(
    Extract(state): Extract<State>,
    Client(client): Client,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let Some(action) = parse_action(&action) else {
        let error = json!({"error": "unknown action: use pause, resume or cancel"});
        return (StatusCode::NOT_FOUND, Json(error)).into_response();
    };
    let done = match run_control(&state, client, &name, action).await {
        Ok(done) => done,
        Err(f) => return (f.status, Json(json!({"error": f.message}))).into_response(),
    };
    let status = match state
        .admin
        .db(move |c| campaigns::counters(c, done.campaign.id).map(|n| (done, n)))
        .await
    {
        Ok((done, counters)) => (CampaignStatus::new(&done.campaign, &counters), done.kicked),
        Err(e) => return unavailable(&e),
    };
    let kicked: Vec<_> = status
        .1
        .into_iter()
        .map(|(server, result)| match result {
            Ok(jobs) => json!({"server": server.to_string(), "kicked": jobs}),
            Err(e) => json!({"server": server.to_string(), "error": e.to_string()}),
        })
        .collect();
    Json(json!({"campaign": status.0, "kicked": kicked})).into_response()
}
