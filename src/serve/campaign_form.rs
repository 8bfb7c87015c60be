//! The dashboard's new-campaign form, `GET /campaigns/new` and
//! `POST /campaigns/new`: name, list, subject, From, content (Markdown or
//! HTML pasted, or a built-in starter), tracking and priority.
//!
//! The form is turned into the body `POST /api/v1/campaigns` takes and
//! handed to the same function ([`create_blocking`]), which runs the checks
//! of `mailsplit campaign create`: nothing is judged here. A refusal is
//! shown above the form and beside the field it names, with everything
//! typed filled in again; a created campaign is shown on its own page,
//! with the stage's warnings (no public URL, no DKIM key, …) above it.
//!
//! No script: a plain form behind the admin gate (session and CSRF token,
//! like every admin POST).

use askama::Template;
use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Extension, Router};

use super::api::campaigns::{create_blocking, NewCampaign};
use super::auth::Access;
use super::page::{rendered, secure, with_status};
use super::State;
use super::{flash, multipart};
use crate::store::lists::{self, ListSummary};

/// The routes of this form (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .route("/campaigns/new", get(blank).post(create))
        .route("/static/campaign_form.css", get(stylesheet))
}

/// What the form posts, every field as typed (checked by the stage).
#[derive(Debug, Default, Clone)]
pub struct NewForm {
    pub name: String,
    pub list: String,
    pub subject: String,
    pub from: String,
    /// `markdown`, `html` or `starter`: what [`Self::content`] is.
    pub format: String,
    pub content: String,
    /// A starter's name, when [`Self::format`] is `starter`.
    pub starter: String,
    /// Checkboxes: present when ticked.
    pub track_opens: Option<String>,
    pub track_clicks: Option<String>,
    pub priority: String,
    /// RFC 3339, or empty: a draft until it is sent from its page.
    pub send_at: String,
}

impl NewForm {
    /// The form as posted, URL-encoded or `multipart/form-data` (with the
    /// content as an uploaded file, field `upload`: Markdown unless its
    /// name ends in `.html` or `.htm`); and why an upload could not be
    /// read.
    pub fn read(content_type: &str, posted: &[u8]) -> (NewForm, Option<String>) {
        let mut f = NewForm::default();
        let Some(boundary) = multipart::boundary(content_type) else {
            for (k, v) in url::form_urlencoded::parse(posted) {
                f.set(&k, v.into_owned());
            }
            return (f, None);
        };
        let Some(parts) = multipart::parse(&boundary, posted) else {
            return (f, Some("the form could not be read: send it again".into()));
        };
        let mut why = None;
        for p in parts {
            match (p.name.as_str(), p.filename) {
                ("upload", Some(file)) if !p.value.is_empty() => match String::from_utf8(p.value) {
                    Ok(text) => {
                        let html = [".html", ".htm"]
                            .iter()
                            .any(|e| file.to_ascii_lowercase().ends_with(e));
                        f.format = if html { "html" } else { "markdown" }.into();
                        f.content = text;
                    }
                    Err(_) => {
                        why = Some(format!(
                            "content: the uploaded file {file:?} is not UTF-8 text"
                        ))
                    }
                },
                (_, Some(_)) => {}
                (name, None) => f.set(name, String::from_utf8_lossy(&p.value).into_owned()),
            }
        }
        (f, why)
    }

    /// One posted field (an upload, read after the fields, wins over the
    /// pasted content).
    fn set(&mut self, name: &str, value: String) {
        if name == "content" && !self.content.is_empty() {
            return;
        }
        match name {
            "name" => self.name = value,
            "list" => self.list = value,
            "subject" => self.subject = value,
            "from" => self.from = value,
            "format" if self.content.is_empty() || self.format.is_empty() => self.format = value,
            "content" => self.content = value,
            "starter" => self.starter = value,
            "track_opens" => self.track_opens = Some(value),
            "track_clicks" => self.track_clicks = Some(value),
            "priority" => self.priority = value,
            "send_at" => self.send_at = value,
            _ => {}
        }
    }

    /// The API's body for this form; `Err` names the field that is not
    /// even of the right type (the only thing this page judges).
    pub fn body(&self) -> Result<NewCampaign, (&'static str, String)> {
        let priority = match self.priority.trim() {
            "" => None,
            p => Some(p.parse::<u32>().map_err(|_| {
                (
                    "priority",
                    format!("priority {p:?} is not a whole number from 0 to 4294967295 (lower goes first)"),
                )
            })?),
        };
        let text = |s: &str| Some(s.to_string());
        let (html, markdown, template) = match self.format.as_str() {
            "html" => (text(&self.content), None, None),
            "starter" => (None, None, text(&self.starter)),
            _ => (None, text(&self.content), None),
        };
        let track = match (self.track_opens.is_some(), self.track_clicks.is_some()) {
            (true, true) => "opens,clicks",
            (true, false) => "opens",
            (false, true) => "clicks",
            (false, false) => "none",
        };
        Ok(NewCampaign {
            name: self.name.trim().to_string(),
            list: self.list.clone(),
            subject: self.subject.clone(),
            from: self.from.clone(),
            html,
            markdown,
            template,
            text: None,
            send_at: Some(self.send_at.trim().to_string()).filter(|s| !s.is_empty()),
            track: Some(track.into()),
            priority,
            public_url: None,
            return_path: None,
            max_failure_rate: None,
            max_complaint_rate: None,
            ab: None,
        })
    }
}

/// Which field a refusal is about, from the words of the stage's message
/// (most specific first: nearly every message names the campaign).
pub fn field_of(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    let named = [
        ("already exists", "name"),
        ("priority", "priority"),
        ("list", "list"),
        ("subject", "subject"),
        ("from", "from"),
        ("send-at", "send_at"),
        ("send_at", "send_at"),
        ("track", "track"),
        ("template", "content"),
        ("markdown", "content"),
        ("html", "content"),
        ("content", "content"),
        ("name", "name"),
    ];
    named
        .iter()
        .find(|(word, _)| m.contains(word))
        .map_or("form", |(_, field)| field)
}

#[derive(Template)]
#[template(path = "admin/campaign_new.html")]
struct Page<'a> {
    f: &'a NewForm,
    lists: &'a [ListSummary],
    starters: &'static [&'static str],
    csrf: &'a str,
    /// The refusal, and the field it is about.
    error: Option<(&'a str, &'static str)>,
}

impl Page<'_> {
    /// The refusal's text when it is about `field`.
    fn error_for(&self, field: &str) -> Option<&str> {
        self.error.filter(|(_, f)| *f == field).map(|(m, _)| m)
    }
}

async fn show(state: &State, access: &Access, f: &NewForm, error: Option<&str>) -> Response {
    let lists = match state.admin.db(lists::overview).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the lists for the campaign form");
            return secure(
                (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response(),
            );
        }
    };
    let csrf = access.csrf(state);
    let page = Page {
        f,
        lists: &lists,
        starters: crate::templates::TEMPLATES,
        csrf: &csrf,
        error: error.map(|m| (m, field_of(m))),
    };
    rendered(&page, "the campaign form")
}

/// `GET /campaigns/new`.
async fn blank(Extract(state): Extract<State>, Extension(access): Extension<Access>) -> Response {
    let f = NewForm {
        format: "markdown".into(),
        ..NewForm::default()
    };
    show(&state, &access, &f, None).await
}

/// `POST /campaigns/new`: create, then the campaign's page; or the form
/// again with the refusal.
async fn create(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    posted: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (f, unreadable) = NewForm::read(content_type, &posted);
    if let Some(why) = unreadable {
        return refused(&state, &access, &f, StatusCode::UNPROCESSABLE_ENTITY, &why).await;
    }
    let body = match f.body() {
        Ok(b) => b,
        Err((_, why)) => {
            return refused(&state, &access, &f, StatusCode::UNPROCESSABLE_ENTITY, &why).await
        }
    };
    let url = state.settings.database_url.clone();
    let made = state
        .admin
        .pool
        .blocking(move || create_blocking(&url, body))
        .await;
    match made {
        Ok(Ok(made)) => {
            let c = &made.campaign;
            tracing::info!(campaign = %c.name, "campaign created from the dashboard");
            let page = format!("/campaigns/{}", c.id);
            let to = Redirect::to(&page).into_response();
            flash::leave(&state, to, &page, &made.warnings)
        }
        Ok(Err(p)) => {
            let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
            refused(&state, &access, &f, status, &p.detail).await
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot create a campaign from the dashboard");
            let why = "the server is too busy to create it now; try again";
            refused(&state, &access, &f, StatusCode::SERVICE_UNAVAILABLE, why).await
        }
    }
}

async fn refused(
    state: &State,
    access: &Access,
    f: &NewForm,
    status: StatusCode,
    why: &str,
) -> Response {
    with_status(show(state, access, f, Some(why)).await, status)
}

/// `GET /static/campaign_form.css`.
async fn stylesheet() -> Response {
    super::page::asset(
        "text/css; charset=utf-8",
        include_str!("../../templates/admin/campaign_form.css"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_land_beside_the_field_they_name() {
        assert_eq!(
            field_of("unknown list \"nope\": create it with `mailsplit import`"),
            "list"
        );
        assert_eq!(field_of("the subject is empty"), "subject");
        assert_eq!(field_of("campaign \"x\" already exists"), "name");
        assert_eq!(field_of("something else"), "form");
    }

    #[test]
    fn the_form_becomes_the_api_body() {
        let f = NewForm {
            name: " spring ".into(),
            format: "markdown".into(),
            content: "# Hi".into(),
            track_clicks: Some("on".into()),
            priority: "7".into(),
            ..NewForm::default()
        };
        let b = f.body().expect("a body");
        assert_eq!(b.name, "spring");
        assert_eq!(b.markdown.as_deref(), Some("# Hi"));
        assert!(b.html.is_none() && b.template.is_none());
        assert_eq!(b.track.as_deref(), Some("clicks"));
        assert_eq!(b.priority, Some(7));
        assert!(b.send_at.is_none());
        let bad = NewForm {
            priority: "soon".into(),
            ..f
        };
        assert_eq!(bad.body().err().map(|e| e.0), Some("priority"));
    }
}
