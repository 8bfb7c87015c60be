//! `GET /dkim`: the DKIM keys as `dkim list` shows them, each with the TXT
//! record to publish (never a private key); `POST /dkim` makes a key as
//! `dkim keygen` does, `POST /dkim/rotate` a pending one as `dkim rotate`;
//! `POST /dkim/DOMAIN/SELECTOR/activate|delete` as `dkim activate` and
//! `dkim delete --selector`. A key just made is shown first, with its
//! record, so it can be copied into the zone.

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::{refusal_status, render, stage, Fields};
use crate::clock::{rfc3339, Precision};
use crate::dkim::{self, DkimAlgorithm, KeyState, KeygenError, StoredKey};
use crate::serve::auth::Access;
use crate::serve::page::path_segment;
use crate::serve::State;

pub fn routes() -> Router<State> {
    Router::new()
        .route("/dkim", get(page).post(keygen))
        .route("/dkim/rotate", post(rotate))
        .route("/dkim/{domain}/{selector}/activate", post(activate))
        .route("/dkim/{domain}/{selector}/delete", post(delete))
}

/// One key as the page shows it: its names, state and TXT record.
pub struct Row {
    pub domain: String,
    pub selector: String,
    pub algorithm: &'static str,
    pub state: &'static str,
    pub active: bool,
    pub created: String,
    /// `SELECTOR._domainkey.DOMAIN`.
    pub name: String,
    /// `v=DKIM1; k=…; p=…`.
    pub value: String,
    /// `/dkim/DOMAIN/SELECTOR`, each part percent-encoded.
    pub path: String,
}

impl Row {
    fn new(k: &StoredKey) -> Row {
        let state = match k.state {
            KeyState::Active => "active (signs)",
            KeyState::Pending => "pending: activate it once its record resolves",
            KeyState::Retired => "retired",
        };
        Row {
            domain: k.domain.clone(),
            selector: k.selector.clone(),
            algorithm: k.algorithm.as_str(),
            state,
            active: k.state == KeyState::Active,
            created: rfc3339(k.created_at, Precision::Seconds),
            name: dkim::txt_name(&k.selector, &k.domain),
            value: dkim::txt_value(k.algorithm, &k.public_key),
            path: format!(
                "/dkim/{}/{}",
                path_segment(&k.domain),
                path_segment(&k.selector)
            ),
        }
    }
}

/// What the keygen and rotate forms held.
#[derive(Default)]
pub struct Held {
    pub domain: String,
    pub selector: String,
    pub algorithm: String,
}

impl Held {
    fn of(form: &Fields) -> Held {
        Held {
            domain: form.one("domain"),
            selector: form.one("selector"),
            algorithm: form.one("algorithm"),
        }
    }

    fn selector(&self) -> Option<&str> {
        Some(self.selector.as_str()).filter(|s| !s.is_empty())
    }

    /// The algorithm chosen; `None` for "as the active key" (rotate).
    fn algorithm(&self) -> Result<Option<DkimAlgorithm>, String> {
        match self.algorithm.as_str() {
            "" => Ok(None),
            a => a.parse().map(Some).map_err(|e| format!("{e}")),
        }
    }
}

#[derive(Template)]
#[template(path = "admin/dkim.html")]
struct Page<'a> {
    csrf: &'a str,
    rows: &'a [Row],
    /// A key just made, with what to do next.
    made: Option<(Row, String)>,
    error: Option<String>,
    held: &'a Held,
    algorithms: &'a [DkimAlgorithm],
}

async fn show(
    state: &State,
    access: &Access,
    status: StatusCode,
    made: Option<(Row, String)>,
    error: Option<String>,
    held: &Held,
) -> Response {
    let rows: Vec<Row> = match stage(state, dkim::keys).await {
        Ok(Ok(all)) => all.iter().map(Row::new).collect(),
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    render(
        status,
        Page {
            csrf: &csrf,
            rows: &rows,
            made,
            error,
            held,
            algorithms: DkimAlgorithm::ALL,
        },
    )
}

/// `GET /dkim`.
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

async fn failed(state: &State, access: &Access, e: &KeygenError, held: &Held) -> Response {
    let status = refusal_status(e.is_usage());
    show(state, access, status, None, Some(e.to_string()), held).await
}

/// A refusal of the form itself (not the stage's): 422 with what was typed.
async fn refused(state: &State, access: &Access, why: String, held: &Held) -> Response {
    let status = StatusCode::UNPROCESSABLE_ENTITY;
    show(state, access, status, None, Some(why), held).await
}

/// `POST /dkim`: a new active key, as `dkim keygen` makes it.
async fn keygen(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let held = Held::of(&Fields::parse(&body));
    let algorithm = match held.algorithm() {
        Ok(a) => a.unwrap_or(DkimAlgorithm::Rsa),
        Err(why) => return refused(&state, &access, why, &held).await,
    };
    let (domain, selector) = (held.domain.clone(), held.selector().map(str::to_string));
    let made = stage(&state, move |c| {
        dkim::keygen(c, &domain, selector.as_deref(), algorithm)
    })
    .await;
    match made {
        Ok(Ok(key)) => {
            let next = format!(
                "Publish this record: running workers sign mail from {} with the key within seconds.",
                key.domain
            );
            let made = Some((Row::new(&key), next));
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

/// `POST /dkim/rotate`: a pending key beside the active one.
async fn rotate(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let held = Held::of(&Fields::parse(&body));
    let algorithm = match held.algorithm() {
        Ok(a) => a,
        Err(why) => return refused(&state, &access, why, &held).await,
    };
    let (domain, selector) = (held.domain.clone(), held.selector().map(str::to_string));
    let made = stage(&state, move |c| {
        dkim::rotate(c, &domain, algorithm, selector.as_deref())
    })
    .await;
    match made {
        Ok(Ok(dkim::Rotated { key, signing })) => {
            let next = format!(
                "Mail from {} is still signed with selector {signing}. Publish this record; once it \
                 resolves, activate the new key, and keep {signing}'s record until the mail it \
                 signed is delivered.",
                key.domain
            );
            let made = Some((Row::new(&key), next));
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

/// `POST /dkim/DOMAIN/SELECTOR/activate`.
async fn activate(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path((domain, selector)): Path<(String, String)>,
) -> Response {
    let done = stage(&state, move |c| dkim::activate(c, &domain, &selector)).await;
    match done {
        Ok(Ok(_)) => Redirect::to("/dkim").into_response(),
        Ok(Err(e)) => failed(&state, &access, &e, &Held::default()).await,
        Err(r) => r,
    }
}

/// `POST /dkim/DOMAIN/SELECTOR/delete`: that one key.
async fn delete(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path((domain, selector)): Path<(String, String)>,
) -> Response {
    let done = stage(&state, move |c| {
        dkim::delete_keys(c, &domain, Some(&selector))
    })
    .await;
    match done {
        Ok(Ok(_)) => Redirect::to("/dkim").into_response(),
        Ok(Err(e)) => failed(&state, &access, &e, &Held::default()).await,
        Err(r) => r,
    }
}
