//! `GET /apikeys`: the `/api/v1` keys as `apikey ls` shows them (never a
//! key: only its hash is stored); `POST /apikeys` makes one as `apikey
//! create` does and shows it once; `POST /apikeys/NAME/revoke` as
//! `apikey revoke`.

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::{refusal_status, render, stage, Fields};
use crate::clock::{rfc3339, Precision};
use crate::serve::api::keys::{self, ApiKey, KeyError, Scope};
use crate::serve::auth::Access;
use crate::serve::page::path_segment;
use crate::serve::State;

pub fn routes() -> Router<State> {
    Router::new()
        .route("/apikeys", get(page).post(create))
        .route("/apikeys/{name}/revoke", post(revoke))
}

/// One key's row.
pub struct Row {
    pub name: String,
    pub path: String,
    pub scopes: String,
    pub created: String,
    pub used: String,
}

impl Row {
    fn new(k: ApiKey) -> Row {
        let scopes: Vec<&str> = k.scopes.iter().map(|s| s.as_str()).collect();
        Row {
            path: path_segment(&k.name),
            scopes: scopes.join(","),
            created: rfc3339(k.created_at, Precision::Seconds),
            used: k
                .last_used_at
                .map_or_else(|| "never".into(), |t| rfc3339(t, Precision::Seconds)),
            name: k.name,
        }
    }
}

#[derive(Template)]
#[template(path = "admin/apikeys.html")]
struct Page<'a> {
    csrf: &'a str,
    rows: &'a [Row],
    scopes: &'a [Scope],
    /// A key just made: `(name, key)`, shown this once.
    made: Option<(&'a str, &'a str)>,
    /// Why the last form was refused.
    error: Option<String>,
    /// What the create form held when it was refused.
    name: &'a str,
}

async fn show(
    state: &State,
    access: &Access,
    status: StatusCode,
    made: Option<(&str, &str)>,
    error: Option<String>,
    name: &str,
) -> Response {
    let rows = match stage(state, keys::list).await {
        Ok(Ok(all)) => all.into_iter().map(Row::new).collect::<Vec<_>>(),
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    render(
        status,
        Page {
            csrf: &csrf,
            rows: &rows,
            scopes: Scope::ALL,
            made,
            error,
            name,
        },
    )
}

/// `GET /apikeys`.
async fn page(Extract(state): Extract<State>, Extension(access): Extension<Access>) -> Response {
    show(&state, &access, StatusCode::OK, None, None, "").await
}

/// `POST /apikeys`: 200 with the key shown once, or 422 with why not.
async fn create(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    // A name and the ticked scopes (`scope` repeated).
    let form = Fields::parse(&body);
    let name = form.one("name");
    let scopes = form.all("scope").join(",");
    let n = name.clone();
    let made = stage(&state, move |c| {
        let scopes = keys::parse_scopes(&scopes)?;
        keys::create(c, &n, &scopes)
    })
    .await;
    match made {
        Ok(Ok(key)) => {
            let made = Some((name.as_str(), key.as_str()));
            show(&state, &access, StatusCode::OK, made, None, "").await
        }
        Ok(Err(e)) => failed(&state, &access, &e, &name).await,
        Err(r) => r,
    }
}

async fn failed(state: &State, access: &Access, e: &KeyError, name: &str) -> Response {
    let status = refusal_status(e.is_usage());
    show(state, access, status, None, Some(e.to_string()), name).await
}

/// `POST /apikeys/NAME/revoke`: back to the list, or the list with why not.
async fn revoke(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
) -> Response {
    let n = name.clone();
    match stage(&state, move |c| keys::revoke(c, &n)).await {
        Ok(Ok(())) => Redirect::to("/apikeys").into_response(),
        Ok(Err(e)) => failed(&state, &access, &e, "").await,
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_never_holds_a_key() {
        let row = Row::new(ApiKey {
            name: "shop app".into(),
            scopes: vec![Scope::Send, Scope::Read],
            created_at: 0,
            last_used_at: None,
        });
        assert_eq!(row.path, "shop%20app");
        assert_eq!(row.scopes, "send,read");
        assert_eq!(row.used, "never");
    }
}
