//! The dashboard: one server-rendered page (askama, `templates/admin/`)
//! with every campaign (state, progress bar, rates, ETA, Pause / Resume /
//! Cancel), the worker fleet, the beanstalkd servers and the rate groups.
//! Its only script (`dashboard.js`, a dozen lines) fetches `/live`, the
//! same template's live part, every two seconds and swaps it in, and asks
//! before a Cancel; without script the page reloads itself. The buttons are
//! plain HTML forms that POST to `/campaigns/NAME/ACTION` with the page's
//! CSRF token and come back to the page (303), doing what the CLI does.

use askama::Template;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};

use super::actions::{parse_action, run_control, ControlFailure};
use super::auth::Access;
use super::page::{asset, secure, CampaignRow};
use super::snapshot::{self, Snapshot};
use super::State;
use crate::worker::fleet::ago;

/// How often the page refreshes itself (the script's interval is the same).
pub const REFRESH_SECONDS: u32 = 2;

/// What the templates show.
pub struct View {
    pub s: Snapshot,
    pub campaigns: Vec<CampaignRow>,
    /// How many campaigns are archived (left out of `campaigns`).
    pub archived: usize,
    /// `HH:MM:SS` UTC of the snapshot.
    pub time: String,
}

impl View {
    fn new(s: Snapshot, archived: &[i64]) -> View {
        let secs = s.at.div_euclid(1000).rem_euclid(86_400);
        View {
            campaigns: s
                .campaigns
                .iter()
                .filter(|c| !archived.contains(&c.id))
                .cloned()
                .map(CampaignRow::new)
                .collect(),
            archived: archived.len(),
            time: format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60),
            s,
        }
    }

    /// `3m` since `at_ms`, as of the snapshot.
    pub fn ago(&self, at_ms: &i64) -> String {
        ago(self.s.at - at_ms)
    }
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct Page<'a> {
    v: &'a View,
    csrf: &'a str,
    refresh: u32,
    /// Whether the page was opened with a login session (shows Log out).
    session: bool,
}

#[derive(Template)]
#[template(path = "admin/live.html")]
struct Live<'a> {
    v: &'a View,
    csrf: &'a str,
}

fn render(page: impl Template) -> Response {
    match page.render() {
        Ok(html) => secure(Html(html).into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot render the dashboard");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

async fn view(state: &State) -> Result<View, Response> {
    let read = async {
        let archived = state.admin.db(crate::store::archive::ids).await?;
        snapshot::take(state).await.map(|s| View::new(s, &archived))
    };
    read.await.map_err(|e| {
        tracing::warn!(error = %e, "cannot read the dashboard's figures");
        secure(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable; retrying on the next refresh\n",
            )
                .into_response(),
        )
    })
}

/// `GET /`: the whole page.
pub async fn page(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
) -> Response {
    show(&state, &access, true).await
}

/// `GET /live`: the part of the page that changes.
pub async fn live(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
) -> Response {
    show(&state, &access, false).await
}

async fn show(state: &State, access: &Access, whole: bool) -> Response {
    let v = match view(state).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    if whole {
        render(Page {
            v: &v,
            csrf: &csrf,
            refresh: REFRESH_SECONDS,
            session: matches!(access, Access::Session(_)),
        })
    } else {
        render(Live { v: &v, csrf: &csrf })
    }
}

/// `POST /campaigns/NAME/ACTION` from the page's buttons: do it, then back
/// to the page; a refusal (e.g. resume a campaign that is not paused) is
/// shown with a link back.
pub async fn control(
    Extract(state): Extract<State>,
    super::guard::Client(client): super::guard::Client,
    Path((name, action)): Path<(String, String)>,
    back: Result<Form<Back>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Some(action) = parse_action(&action) else {
        return failure_page(
            StatusCode::NOT_FOUND,
            "unknown action: use pause, resume or cancel",
        );
    };
    match run_control(&state, client, &name, action).await {
        // The campaign page's buttons lead back to it.
        Ok(done) if back.is_ok_and(|b| b.back == "page") => {
            Redirect::to(&format!("/campaigns/{}", done.campaign.id)).into_response()
        }
        Ok(_) => Redirect::to("/").into_response(),
        Err(ControlFailure { status, message }) => failure_page(status, &message),
    }
}

/// Where a button leads afterwards: `page` for the campaign's page,
/// anything else the dashboard.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct Back {
    back: String,
}

#[derive(Template)]
#[template(path = "admin/refused.html")]
struct Refused<'a> {
    message: &'a str,
}

fn failure_page(status: StatusCode, message: &str) -> Response {
    let mut page = render(Refused { message });
    *page.status_mut() = status;
    page
}

/// `GET /static/dashboard.css` and `/static/dashboard.js`.
pub async fn stylesheet() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../../templates/admin/dashboard.css"),
    )
}

pub async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../../templates/admin/dashboard.js"),
    )
}
