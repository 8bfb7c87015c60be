//! The subscriber page's forms: `POST /subscribers/EMAIL/unsubscribe`,
//! `POST /subscribers/EMAIL/remove` (field `list`), and forget, which
//! asks first: `GET /subscribers/EMAIL/forget` shows what will be erased
//! and a button that posts to the same path. Each calls the stage the CLI
//! and `/api/v1` use ([`optouts::set_unsubscribed`], [`lists::remove`],
//! [`subscriber::forget`]), which checks its own input. The admin gate has
//! checked the CSRF field of every POST before these run. Also what both
//! subscriber modules answer with (render, 404, 503).

use askama::Template;
use axum::extract::{Path, State as Extract};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::auth::Access;
use super::page::{path_segment, secure};
use super::State;
use crate::audience::lists::{self, ListError};
use crate::audience::subscriber::{self, SubscriberError};
use crate::store::{optouts, subscribers, StoreError};

pub fn render(page: impl Template) -> Response {
    match page.render() {
        Ok(html) => secure(Html(html).into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot render a subscriber page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

pub fn failed(e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "cannot read the subscriber pages' figures");
    secure((StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response())
}

pub fn not_found() -> Response {
    secure((StatusCode::NOT_FOUND, "no subscriber with this address\n").into_response())
}

/// A value for a query string (its unreserved characters kept).
pub fn query_value(v: &str) -> String {
    path_segment(v)
}

/// 303 to `to`.
fn see(to: String) -> Response {
    secure((StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response())
}

fn back(email: &str) -> Response {
    see(format!("/subscribers/{}", path_segment(email)))
}

fn refused(why: &dyn std::fmt::Display) -> Response {
    secure((StatusCode::UNPROCESSABLE_ENTITY, format!("{why}\n")).into_response())
}

/// `POST /subscribers/EMAIL/unsubscribe`: as a `PATCH` of the API with
/// status `unsubscribed`; an address that is not active stays as it is.
pub async fn unsubscribe(Extract(state): Extract<State>, Path(email): Path<String>) -> Response {
    let lookup = email.clone();
    let done = state
        .admin
        .db(move |c| {
            let Ok(key) = crate::mailbox::key(lookup.trim()) else {
                return Ok(false);
            };
            let Some(s) = subscribers::find(c, &key)? else {
                return Ok(false);
            };
            optouts::set_unsubscribed(c, s.id, "admin")?;
            Ok::<_, StoreError>(true)
        })
        .await;
    match done {
        Ok(true) => back(&email),
        Ok(false) => not_found(),
        Err(e) => failed(&e),
    }
}

#[derive(Deserialize)]
pub struct RemoveForm {
    list: String,
}

/// `POST /subscribers/EMAIL/remove`: `list rm LIST EMAIL`.
pub async fn remove(
    Extract(state): Extract<State>,
    Path(email): Path<String>,
    Form(form): Form<RemoveForm>,
) -> Response {
    let who = vec![email.clone()];
    let done = state
        .admin
        .db(move |c| Ok(lists::remove(c, &form.list, &who)))
        .await;
    match done {
        Ok(Ok(_)) => back(&email),
        Ok(Err(ListError::Store(e))) if !e.is_usage() => failed(&e),
        Ok(Err(e)) => refused(&e),
        Err(e) => failed(&e),
    }
}

#[derive(Template)]
#[template(path = "admin/forget.html")]
struct ConfirmPage<'a> {
    email: &'a str,
    path: &'a str,
    csrf: &'a str,
}

/// `GET /subscribers/EMAIL/forget`: the confirmation step.
pub async fn confirm(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(email): Path<String>,
) -> Response {
    let csrf = access.csrf(&state);
    render(ConfirmPage {
        path: &path_segment(&email),
        email: &email,
        csrf: &csrf,
    })
}

/// `POST /subscribers/EMAIL/forget`: `subscriber forget EMAIL`; then the
/// search page, saying so.
pub async fn forget(Extract(state): Extract<State>, Path(email): Path<String>) -> Response {
    let done = state
        .admin
        .db(move |c| Ok(subscriber::forget(c, &email)))
        .await;
    match done {
        Ok(Ok(f)) => see(format!("/subscribers?forgotten={}", query_value(&f.key))),
        Ok(Err(SubscriberError::Store(e))) if !e.is_usage() => failed(&e),
        Ok(Err(e)) => refused(&e),
        Err(e) => failed(&e),
    }
}
