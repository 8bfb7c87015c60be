//! Archiving from the dashboard: `POST /campaigns/NAME/archive` and
//! `…/unarchive` ([`campaign::archive`], which takes only a finished
//! campaign), and `GET /campaigns/archived`, the archived campaigns the
//! dashboard's list leaves out.

use askama::Template;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::api::campaigns::refused as problem_of;
use super::auth::Access;
use super::campaign_actions::refusal;
use super::page::{rendered, secure, CampaignRow};
use super::State;
use crate::campaign::{self, archive::archive};
use crate::store::{archive as archived, StoreError};

/// The routes (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .route("/campaigns/archived", get(page))
        .route("/campaigns/{name}/archive", post(hide))
        .route("/campaigns/{name}/unarchive", post(show))
}

async fn set(state: &State, name: String, on: bool) -> Response {
    let campaign = name.clone();
    let done = state
        .admin
        .db(move |c| Ok(archive(c, &campaign, on)))
        .await
        .unwrap_or_else(|e: StoreError| Err(e.into()));
    match done {
        Ok(_) => {
            let to = if on { "/" } else { "/campaigns/archived" };
            Redirect::to(to).into_response()
        }
        Err(e) => refusal(&name, problem_of(e)),
    }
}

async fn hide(Extract(state): Extract<State>, Path(name): Path<String>) -> Response {
    set(&state, name, true).await
}

async fn show(Extract(state): Extract<State>, Path(name): Path<String>) -> Response {
    set(&state, name, false).await
}

#[derive(Template)]
#[template(path = "admin/archived.html")]
struct Page<'a> {
    campaigns: &'a [CampaignRow],
    csrf: &'a str,
}

/// `GET /campaigns/archived`.
async fn page(Extract(state): Extract<State>, Extension(access): Extension<Access>) -> Response {
    let read = state
        .admin
        .db(|c| {
            let ids = archived::ids(c)?;
            let all = campaign::statuses(c, None)?;
            Ok(all
                .into_iter()
                .filter(|s| ids.contains(&s.id))
                .collect::<Vec<_>>())
        })
        .await;
    let rows: Vec<CampaignRow> = match read {
        Ok(all) => all.into_iter().map(CampaignRow::new).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the archived campaigns");
            return secure(
                (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response(),
            );
        }
    };
    let csrf = access.csrf(&state);
    let page = Page {
        campaigns: &rows,
        csrf: &csrf,
    };
    rendered(&page, "the archived campaigns")
}
