//! `GET /lists`: the lists as `list ls` shows them (members, active, shown
//! on `/subscribe`, double or single opt-in); `POST /lists` makes one as
//! `list create` does, `POST /lists/set` changes one as `list set`, and
//! `POST /lists/NAME/delete` deletes one as `list delete` (refused while a
//! campaign of it may still send; its members stay on file).

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::{refusal_status, render, stage, Fields};
use crate::audience::lists::{self, Face, ListError};
use crate::serve::auth::Access;
use crate::serve::page::path_segment;
use crate::serve::State;
use crate::store::lists::ListSummary;

pub fn routes() -> Router<State> {
    Router::new()
        .route("/lists", get(page).post(create))
        .route("/lists/set", post(set))
        .route("/lists/{name}/delete", post(delete))
}

/// One list's row.
pub struct Row {
    pub l: ListSummary,
    pub path: String,
}

/// What the create and change forms held.
#[derive(Default)]
pub struct Held {
    pub name: String,
    pub title: String,
    pub public: String,
    pub opt_in: String,
}

impl Held {
    fn of(form: &Fields) -> Held {
        Held {
            name: form.one("name"),
            title: form.one("title"),
            public: form.one("public"),
            opt_in: form.one("opt_in"),
        }
    }

    /// The face asked for: an empty field (or "keep") changes nothing.
    fn face(&self) -> Face {
        Face {
            title: Some(self.title.clone()).filter(|t| !t.is_empty()),
            is_public: match self.public.as_str() {
                "public" => Some(true),
                "private" => Some(false),
                _ => None,
            },
            double_opt_in: match self.opt_in.as_str() {
                "double" => Some(true),
                "single" => Some(false),
                _ => None,
            },
        }
    }
}

#[derive(Template)]
#[template(path = "admin/lists.html")]
struct Page<'a> {
    csrf: &'a str,
    rows: &'a [Row],
    /// What the last form did.
    done: Option<String>,
    error: Option<String>,
    held: &'a Held,
}

async fn show(
    state: &State,
    access: &Access,
    status: StatusCode,
    outcome: Result<Option<String>, String>,
    held: &Held,
) -> Response {
    let rows: Vec<Row> = match stage(state, lists::overview).await {
        Ok(Ok(all)) => all
            .into_iter()
            .map(|l| Row {
                path: format!("/lists/{}", path_segment(&l.name)),
                l,
            })
            .collect(),
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    let (done, error) = match outcome {
        Ok(done) => (done, None),
        Err(e) => (None, Some(e)),
    };
    let page = Page {
        csrf: &csrf,
        rows: &rows,
        done,
        error,
        held,
    };
    render(status, page)
}

/// The page after a form: what it did, or the stage's refusal with what
/// was typed.
async fn answer(
    state: &State,
    access: &Access,
    done: Result<Result<String, ListError>, Response>,
    held: &Held,
) -> Response {
    match done {
        Ok(Ok(said)) => {
            show(
                state,
                access,
                StatusCode::OK,
                Ok(Some(said)),
                &Held::default(),
            )
            .await
        }
        Ok(Err(e)) => {
            let status = refusal_status(e.is_usage());
            show(state, access, status, Err(e.to_string()), held).await
        }
        Err(r) => r,
    }
}

/// `GET /lists`.
async fn page(Extract(state): Extract<State>, Extension(access): Extension<Access>) -> Response {
    show(&state, &access, StatusCode::OK, Ok(None), &Held::default()).await
}

/// `POST /lists`: a new, empty list.
async fn create(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let held = Held::of(&Fields::parse(&body));
    let (name, face) = (held.name.clone(), held.face());
    let done = stage(&state, move |c| {
        lists::create(c, &name, &face).map(|()| format!("List {name} created."))
    })
    .await;
    answer(&state, &access, done, &held).await
}

/// `POST /lists/set`: a list's title, whether `/subscribe` shows it, its
/// opt-in.
async fn set(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let held = Held::of(&Fields::parse(&body));
    let (name, face) = (held.name.clone(), held.face());
    let done = stage(&state, move |c| {
        lists::set(c, &name, &face).map(|()| format!("List {name} changed."))
    })
    .await;
    answer(&state, &access, done, &held).await
}

/// `POST /lists/NAME/delete`.
async fn delete(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
) -> Response {
    let done = stage(&state, move |c| {
        lists::delete(c, &name).map(|d| {
            if d.kept_for.is_empty() {
                format!("List {name} deleted ({} members taken off; they stay on file).", d.members)
            } else {
                format!(
                    "List {name} emptied ({} members taken off; they stay on file); its name stays while campaigns name it: {}.",
                    d.members,
                    d.kept_for.join(", ")
                )
            }
        })
    })
    .await;
    answer(&state, &access, done, &Held::default()).await
}
