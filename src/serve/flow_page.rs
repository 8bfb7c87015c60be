//! The dashboard's flow pages: `GET /flows`, every flow with its
//! trigger, state, steps and entries; `GET /flows/NAME`, one flow's
//! report (entered, each step's messages, leavers by reason): what
//! `flow ls` and `flow report` print, read by the same stage functions
//! ([`crate::flows::list`], [`crate::flows::report`]); a flow's Pause or
//! Resume button posts to `/flows/NAME/pause|resume`, which calls
//! [`crate::flows::set_paused`] as `flow pause|resume` does. Behind the
//! admin gate (CSRF on the POST), with every admin page's headers
//! ([`secure`]); no script.

use askama::Template;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::Redirect;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::auth::Access;
use super::page::{path_segment, secure};
use super::State;
use crate::flows::{self, show_delay, FlowError, FlowRow, Report};

/// The routes of these pages (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .route("/flows", get(list))
        .route("/flows/{name}", get(one))
        .route("/flows/{name}/{action}", post(control))
}

/// One flow in the list, with its link.
pub struct ListRow {
    pub f: FlowRow,
    /// The name as a URL path segment.
    pub path: String,
    /// `DELAY:TEMPLATE` each.
    pub steps: String,
}

#[derive(Template)]
#[template(path = "admin/flows.html")]
struct ListPage<'a> {
    rows: &'a [ListRow],
}

/// One step's line on a flow's page.
pub struct StepLine {
    pub n: usize,
    pub delay: String,
    pub s: flows::StepReport,
}

#[derive(Template)]
#[template(path = "admin/flow.html")]
struct FlowPage<'a> {
    r: &'a Report,
    csrf: &'a str,
    /// The name as a URL path segment.
    path: &'a str,
    /// Why the last Pause or Resume was refused.
    error: Option<String>,
    steps: &'a [StepLine],
    /// Leavers in all.
    left: i64,
}

fn render(page: impl Template) -> Response {
    match page.render() {
        Ok(html) => secure(Html(html).into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot render a flow page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

fn failed(e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "cannot read the flow pages' figures");
    secure((StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response())
}

/// `GET /flows`.
async fn list(Extract(state): Extract<State>) -> Response {
    let all = match state.admin.db(|c| Ok(flows::list(c))).await {
        Ok(Ok(all)) => all,
        Ok(Err(e)) => return failed(&e),
        Err(e) => return failed(&e),
    };
    let rows: Vec<ListRow> = all
        .into_iter()
        .map(|f| ListRow {
            path: path_segment(&f.name),
            steps: f
                .steps
                .iter()
                .map(|s| format!("{}:{}", show_delay(s.delay_ms), s.template))
                .collect::<Vec<_>>()
                .join(" "),
            f,
        })
        .collect();
    render(ListPage { rows: &rows })
}

/// `GET /flows/NAME`.
async fn one(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
) -> Response {
    show(&state, &access, name, None).await
}

/// `POST /flows/NAME/pause|resume`: back to the flow's page, or the page
/// with the refusal (already paused, unknown flow) above its button.
async fn control(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => return secure((StatusCode::NOT_FOUND, "use pause or resume\n").into_response()),
    };
    let n = name.clone();
    match state
        .admin
        .db(move |c| Ok(flows::set_paused(c, &n, paused)))
        .await
    {
        Ok(Ok(())) => Redirect::to(&format!("/flows/{}", path_segment(&name))).into_response(),
        Ok(Err(e)) if e.is_usage() => {
            let mut page = show(&state, &access, name, Some(e.to_string())).await;
            if page.status() == StatusCode::OK {
                *page.status_mut() = StatusCode::CONFLICT;
            }
            page
        }
        Ok(Err(e)) => failed(&e),
        Err(e) => failed(&e),
    }
}

async fn show(state: &State, access: &Access, name: String, error: Option<String>) -> Response {
    let r = match state.admin.db(move |c| Ok(flows::report(c, &name))).await {
        Ok(Ok(r)) => r,
        Ok(Err(FlowError::Unknown(_))) => {
            return secure((StatusCode::NOT_FOUND, "no such flow\n").into_response())
        }
        Ok(Err(e)) => return failed(&e),
        Err(e) => return failed(&e),
    };
    let steps: Vec<StepLine> = r
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| StepLine {
            n: i + 1,
            delay: show_delay(s.delay_ms),
            s: s.clone(),
        })
        .collect();
    let left = r.left.values().sum();
    let csrf = access.csrf(state);
    render(FlowPage {
        r: &r,
        csrf: &csrf,
        path: &path_segment(&r.name),
        error,
        steps: &steps,
        left,
    })
}
