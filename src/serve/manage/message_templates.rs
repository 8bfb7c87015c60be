//! `GET /templates`: the message templates as `template ls` shows them;
//! `POST /templates` stores one as `template create` does, from content
//! pasted as HTML or Markdown; `GET /templates/NAME` shows one (its source
//! as text, never rendered into the page) with the edit form, `POST
//! /templates/NAME` stores a new version as `template edit` does, and
//! `POST /templates/NAME/remove` removes it as `template rm`. The stage
//! functions check everything (Jinja, the sender, the return path).

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::{refusal_status, render, stage, Fields};
use crate::campaign::ContentSource;
use crate::clock::{rfc3339, Precision};
use crate::messages::templates::{self, NewTemplate, TemplateEdit};
use crate::messages::MessageError;
use crate::serve::api::campaigns::Scratch;
use crate::serve::auth::Access;
use crate::serve::page::path_segment;
use crate::serve::State;
use crate::store::message_templates::{MessageTemplate, Stream};

pub fn routes() -> Router<State> {
    Router::new()
        .route("/templates", get(list_page).post(create))
        .route("/templates/{name}", get(one_page).post(edit))
        .route("/templates/{name}/remove", post(remove))
}

/// One template's row.
pub struct Row {
    pub t: MessageTemplate,
    pub path: String,
    pub updated: String,
}

impl Row {
    fn new(t: MessageTemplate) -> Row {
        Row {
            path: format!("/templates/{}", path_segment(&t.name)),
            updated: rfc3339(t.updated_at, Precision::Seconds),
            t,
        }
    }
}

/// What a create or edit form held (kept when it is refused).
#[derive(Default)]
pub struct Held {
    pub name: String,
    pub subject: String,
    pub from: String,
    pub stream: String,
    pub return_path: String,
    /// `html` or `markdown`.
    pub format: String,
    pub content: String,
    pub text: String,
    /// `opens`, `clicks`, `opens,clicks` or `none`; empty: the default
    /// (create) or what is stored (edit).
    pub track: String,
    /// Where tracking and the recipient's pages point; empty on edit
    /// removes it, as `--public-url ""` does.
    pub public_url: String,
}

impl Held {
    fn of(form: &Fields) -> Held {
        Held {
            name: form.one("name"),
            subject: form.one("subject"),
            from: form.one("from"),
            stream: form.one("stream"),
            return_path: form.one("return_path"),
            format: form.one("format"),
            content: form.all("content").concat(),
            text: form.all("text").concat(),
            track: form.one("track"),
            public_url: form.one("public_url"),
        }
    }

    /// The pasted content as the stage reads it (files in `dir`); `None`
    /// when nothing was pasted.
    fn content(&self, dir: &Scratch) -> Result<Option<ContentSource>, MessageError> {
        if self.content.trim().is_empty() {
            return Ok(None);
        }
        let io = |e: std::io::Error| MessageError::BadData(format!("cannot hold the content: {e}"));
        Ok(Some(match self.format.as_str() {
            "markdown" => {
                ContentSource::Markdown(dir.file("content.md", &self.content).map_err(io)?)
            }
            _ => ContentSource::Html {
                html: dir.file("content.html", &self.content).map_err(io)?,
                text: match self.text.trim() {
                    "" => None,
                    _ => Some(dir.file("content.txt", &self.text).map_err(io)?),
                },
            },
        }))
    }

    fn stream(&self) -> Result<Option<Stream>, MessageError> {
        match self.stream.as_str() {
            "" => Ok(None),
            s => s
                .parse()
                .map(Some)
                .map_err(|e| MessageError::BadData(format!("{e}"))),
        }
    }

    /// `template create`'s request.
    fn new_template(&self, dir: &Scratch) -> Result<NewTemplate, MessageError> {
        let content = self
            .content(dir)?
            .ok_or_else(|| MessageError::BadData("paste the content (HTML or Markdown)".into()))?;
        Ok(NewTemplate {
            subject: self.subject.clone(),
            from: self.from.clone(),
            content,
            stream: self.stream()?.unwrap_or(Stream::Transactional),
            return_path: Some(self.return_path.clone()).filter(|r| !r.is_empty()),
            track: Some(self.track.clone()).filter(|t| !t.is_empty()),
            public_url: Some(self.public_url.clone()).filter(|u| !u.is_empty()),
        })
    }

    /// `template edit`'s request: an empty field keeps what is stored
    /// (the return path: empty removes it, as `--return-path ""` does).
    fn edit(&self, dir: &Scratch) -> Result<TemplateEdit, MessageError> {
        let some = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        Ok(TemplateEdit {
            subject: some(&self.subject),
            from: some(&self.from),
            content: self.content(dir)?,
            stream: self.stream()?,
            return_path: Some(self.return_path.clone()),
            track: some(&self.track),
            public_url: Some(self.public_url.clone()),
        })
    }
}

#[derive(Template)]
#[template(path = "admin/message_templates.html")]
struct ListPage<'a> {
    csrf: &'a str,
    rows: &'a [Row],
    error: Option<String>,
    held: &'a Held,
    streams: &'a [Stream],
}

#[derive(Template)]
#[template(path = "admin/message_template.html")]
struct OnePage<'a> {
    csrf: &'a str,
    row: &'a Row,
    error: Option<String>,
    held: &'a Held,
    streams: &'a [Stream],
    /// What the last edit stored, and its warnings.
    saved: Option<(i64, Vec<String>)>,
}

async fn show_list(
    state: &State,
    access: &Access,
    status: StatusCode,
    error: Option<String>,
    held: &Held,
) -> Response {
    let rows: Vec<Row> = match stage(state, templates::list).await {
        Ok(Ok(all)) => all.into_iter().map(Row::new).collect(),
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    let page = ListPage {
        csrf: &csrf,
        rows: &rows,
        error,
        held,
        streams: Stream::ALL,
    };
    render(status, page)
}

async fn show_one(
    state: &State,
    access: &Access,
    name: String,
    status: StatusCode,
    error: Option<String>,
    saved: Option<(i64, Vec<String>)>,
    typed: Option<Held>,
) -> Response {
    let row = match stage(state, move |c| templates::find(c, &name)).await {
        Ok(Ok(t)) => Row::new(t),
        Ok(Err(e)) if e.is_usage() => return not_found(&e),
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    let held = typed.unwrap_or_else(|| Held {
        subject: row.t.subject.clone(),
        from: row.t.from_addr.clone(),
        return_path: row.t.return_path.clone().unwrap_or_default(),
        track: row.t.track.clone(),
        public_url: row.t.public_url.clone().unwrap_or_default(),
        ..Held::default()
    });
    let csrf = access.csrf(state);
    let page = OnePage {
        csrf: &csrf,
        row: &row,
        error,
        held: &held,
        streams: Stream::ALL,
        saved,
    };
    render(status, page)
}

fn not_found(e: &MessageError) -> Response {
    crate::serve::page::secure((StatusCode::NOT_FOUND, format!("{e}\n")).into_response())
}

/// `GET /templates`.
async fn list_page(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
) -> Response {
    show_list(&state, &access, StatusCode::OK, None, &Held::default()).await
}

/// `GET /templates/NAME`.
async fn one_page(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
) -> Response {
    show_one(&state, &access, name, StatusCode::OK, None, None, None).await
}

/// `POST /templates`: to the new template's page, or the list with why not.
async fn create(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let held = Held::of(&Fields::parse(&body));
    let request = Scratch::new()
        .map_err(|e| MessageError::BadData(format!("cannot hold the content: {e}")))
        .and_then(|dir| Ok((held.new_template(&dir)?, dir)));
    let name = held.name.clone();
    let done = stage(&state, move |c| {
        let (t, _dir) = request?;
        templates::create(c, &name, &t)
    })
    .await;
    match done {
        Ok(Ok(_)) => {
            Redirect::to(&format!("/templates/{}", path_segment(&held.name))).into_response()
        }
        Ok(Err(e)) => {
            let status = refusal_status(e.is_usage());
            show_list(&state, &access, status, Some(e.to_string()), &held).await
        }
        Err(r) => r,
    }
}

/// `POST /templates/NAME`: a new version, shown on the template's page.
async fn edit(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let held = Held::of(&Fields::parse(&body));
    let request = Scratch::new()
        .map_err(|e| MessageError::BadData(format!("cannot hold the content: {e}")))
        .and_then(|dir| Ok((held.edit(&dir)?, dir)));
    let n = name.clone();
    let done = stage(&state, move |c| {
        let (e, _dir) = request?;
        templates::edit(c, &n, &e)
    })
    .await;
    match done {
        Ok(Ok(saved)) => {
            let saved = Some((saved.version, saved.warnings));
            show_one(&state, &access, name, StatusCode::OK, None, saved, None).await
        }
        Ok(Err(e)) => {
            let status = refusal_status(e.is_usage());
            let why = Some(e.to_string());
            show_one(&state, &access, name, status, why, None, Some(held)).await
        }
        Err(r) => r,
    }
}

/// `POST /templates/NAME/remove`: back to the list.
async fn remove(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
) -> Response {
    match stage(&state, move |c| templates::remove(c, &name)).await {
        Ok(Ok(())) => Redirect::to("/templates").into_response(),
        Ok(Err(e)) => {
            let status = refusal_status(e.is_usage());
            show_list(
                &state,
                &access,
                status,
                Some(e.to_string()),
                &Held::default(),
            )
            .await
        }
        Err(r) => r,
    }
}
