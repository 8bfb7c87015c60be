//! `GET /webhooks`: the webhooks as `webhook ls` shows them (the URL with
//! any password redacted, never a secret); `POST /webhooks` adds one as
//! `webhook add` does (a generated secret is shown once);
//! `POST /webhooks/ID/remove` as `webhook rm`.

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::{refusal_status, render, stage, Fields};
use crate::serve::auth::Access;
use crate::serve::State;
use crate::store::outbox::EventKind;
use crate::store::webhooks::Webhook;
use crate::webhooks::{self, WebhookError};

pub fn routes() -> Router<State> {
    Router::new()
        .route("/webhooks", get(page).post(add))
        .route("/webhooks/{id}/remove", post(remove))
}

/// One webhook's row.
pub struct Row {
    pub h: Webhook,
    /// The URL, any password in it redacted.
    pub url: String,
    pub pending: i64,
}

/// What the add form held.
#[derive(Default)]
pub struct Held {
    pub url: String,
    pub events: String,
    pub local: bool,
}

#[derive(Template)]
#[template(path = "admin/webhooks.html")]
struct Page<'a> {
    csrf: &'a str,
    rows: &'a [Row],
    /// A webhook just added and the secret made for it, shown this once.
    made: Option<(i64, Option<&'a str>)>,
    error: Option<String>,
    held: &'a Held,
    events: &'a str,
}

async fn show(
    state: &State,
    access: &Access,
    status: StatusCode,
    made: Option<(i64, Option<&str>)>,
    error: Option<String>,
    held: &Held,
) -> Response {
    let rows: Vec<Row> = match stage(state, webhooks::list).await {
        Ok(Ok(all)) => all
            .into_iter()
            .map(|(h, pending)| Row {
                url: crate::redact::url(&h.url),
                h,
                pending,
            })
            .collect(),
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    let events: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
    render(
        status,
        Page {
            csrf: &csrf,
            rows: &rows,
            made,
            error,
            held,
            events: &events.join(","),
        },
    )
}

/// `GET /webhooks`.
async fn page(Extract(state): Extract<State>, Extension(access): Extension<Access>) -> Response {
    show(
        &state,
        &access,
        StatusCode::OK,
        None,
        None,
        &Held::default(),
    )
    .await
}

/// `POST /webhooks` (`url`, `events`, `secret`, `allow_local`): 200 with
/// the secret shown once, or 422 with why not.
async fn add(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let form = Fields::parse(&body);
    let held = Held {
        url: form.one("url"),
        events: form.one("events"),
        local: form.ticked("allow_local"),
    };
    let secret = Some(form.one("secret")).filter(|s| !s.is_empty());
    let (url, events, local) = (held.url.clone(), held.events.clone(), held.local);
    // The check for a local address resolves the host: off the request
    // threads, as every stage call here is.
    let added = stage(&state, move |c| {
        webhooks::add(c, &url, &events, secret.as_deref(), local)
    })
    .await;
    match added {
        Ok(Ok(a)) => {
            let made = Some((a.id, a.generated_secret.as_deref()));
            show(
                &state,
                &access,
                StatusCode::OK,
                made,
                None,
                &Held::default(),
            )
            .await
        }
        Ok(Err(e)) => failed(&state, &access, &e, &held).await,
        Err(r) => r,
    }
}

async fn failed(state: &State, access: &Access, e: &WebhookError, held: &Held) -> Response {
    let status = refusal_status(e.is_usage());
    show(state, access, status, None, Some(e.to_string()), held).await
}

/// `POST /webhooks/ID/remove`.
async fn remove(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(id): Path<i64>,
) -> Response {
    match stage(&state, move |c| webhooks::remove(c, id)).await {
        Ok(Ok(())) => Redirect::to("/webhooks").into_response(),
        Ok(Err(e)) => failed(&state, &access, &e, &Held::default()).await,
        Err(r) => r,
    }
}
