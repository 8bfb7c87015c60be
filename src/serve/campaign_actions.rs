//! The campaign page's forms: send now or schedule (`POST
//! /campaigns/NAME/send`), a test send (`POST /campaigns/NAME/test`) and
//! the edit form (`GET`/`POST /campaigns/NAME/edit`).
//!
//! Each hands what was typed to the stage the CLI runs, which judges it:
//! the schedule and the edit to `campaign edit` ([`campaign::edit`], the
//! same states and messages), sending to the splitter as `POST
//! /api/v1/campaigns/NAME/enqueue` starts it, the test to `campaign
//! test` ([`send_test`], through the workers' relay `SMTP_URL`, subject
//! `[TEST] …`, nothing in the ledger). Pause, resume and cancel are the
//! dashboard's own buttons ([`super::dashboard::control`]).

use askama::Template;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use serde::Deserialize;

use super::api::campaigns::{begin_enqueue, readable, refused as problem_of, Scratch};
use super::api::Problem;
use super::auth::Access;
use super::campaign_form::field_of;
use super::page::{path_segment, rendered, secure, with_status};
use super::State;
use crate::campaign::test_send::send_test;
use crate::campaign::{self, control, CampaignError, EditRequest};
use crate::config::{SmtpUrl, DEFAULT_SMTP_TIMEOUT};
use crate::store::{campaigns, content, Conn};

/// The routes of these forms (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .route("/campaigns/{name}/send", post(send))
        .route("/campaigns/{name}/test", post(test))
        .route("/campaigns/{name}/edit", get(edit_form).post(edit))
}

/// The outcome of a form, shown with a way back to the campaign's page.
#[derive(Template)]
#[template(path = "admin/campaign_done.html")]
struct Done<'a> {
    name: &'a str,
    /// The campaign page's path (`/campaigns/ID`), or the dashboard.
    back: &'a str,
    ok: bool,
    lines: &'a [String],
}

fn done(status: StatusCode, name: &str, back: &str, lines: &[String]) -> Response {
    let ok = status.is_success();
    let page = Done {
        name,
        back,
        ok,
        lines,
    };
    with_status(rendered(&page, "a campaign form's outcome"), status)
}

pub(super) fn refusal(name: &str, p: Problem) -> Response {
    let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
    done(status, name, "/", &[p.detail])
}

/// Run `f` with a connection of its own on the admin side's threads.
async fn blocking<T: Send + 'static>(
    state: &State,
    f: impl FnOnce(&mut Conn) -> Result<T, Problem> + Send + 'static,
) -> Result<T, Problem> {
    let url = state.settings.database_url.clone();
    state
        .admin
        .pool
        .blocking(move || {
            let mut conn = Conn::open(&url).map_err(|e| problem_of(e.into()))?;
            f(&mut conn)
        })
        .await
        .map_err(|e| Problem::internal(&e))?
}

/// Store an edit as `campaign edit` does, making jobs delayed for a later
/// start ready when it moved earlier.
fn store_edit(conn: &mut Conn, state: &State, req: &EditRequest) -> Result<i64, CampaignError> {
    let edited = campaign::edit::edit(conn, req)?;
    if edited.earlier {
        for (server, kicked) in
            control::kick_delayed(conn, &state.settings.servers, &state.settings.tube)
        {
            if let Err(e) = kicked {
                tracing::warn!(%server, error = %e, "cannot make delayed jobs ready after an earlier start");
            }
        }
    }
    Ok(campaigns::find(conn, &edited.name)?.id)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendForm {
    /// RFC 3339: schedule; empty: send now.
    send_at: String,
}

/// `POST /campaigns/NAME/send`: schedule (as `campaign edit --send-at`)
/// when a time is given, then enqueue.
async fn send(
    Extract(state): Extract<State>,
    Path(name): Path<String>,
    Form(f): Form<SendForm>,
) -> Response {
    let at = f.send_at.trim().to_string();
    if !at.is_empty() {
        let shared = state.clone();
        let req = EditRequest {
            name: name.clone(),
            send_at: Some(at),
            ..EditRequest::default()
        };
        let stored = blocking(&state, move |c| {
            store_edit(c, &shared, &req).map_err(problem_of)
        })
        .await;
        if let Err(p) = stored {
            return refusal(&name, p);
        }
    }
    match begin_enqueue(&state, name.clone()).await {
        Ok(c) => Redirect::to(&format!("/campaigns/{}", c.id)).into_response(),
        Err(p) => refusal(&name, p),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TestForm {
    /// Addresses, comma-separated.
    to: String,
    /// The list member it is rendered for; empty: the first active one.
    recipient: String,
}

/// `POST /campaigns/NAME/test`: `campaign test NAME --to … [--recipient …]`.
async fn test(
    Extract(state): Extract<State>,
    Path(name): Path<String>,
    Form(f): Form<TestForm>,
) -> Response {
    let to: Vec<String> =
        f.to.split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
    let smtp = state.settings.smtp_url.clone();
    let campaign = name.clone();
    let sent = blocking(&state, move |c| {
        let id = campaigns::find(c, &campaign)
            .map_err(|e| problem_of(e.into()))?
            .id;
        if to.is_empty() {
            let e =
                CampaignError::Bad("--to: give at least one address to send the test to".into());
            return Err(problem_of(e));
        }
        let url = SmtpUrl::parse(&smtp).map_err(|e| problem_of(e.into()))?;
        let recipient = Some(f.recipient.trim()).filter(|r| !r.is_empty());
        send_test(c, &campaign, recipient, &to, url, DEFAULT_SMTP_TIMEOUT)
            .map(|o| (id, o))
            .map_err(problem_of)
    })
    .await;
    let (id, outcomes) = match sent {
        Ok(s) => s,
        Err(p) => return refusal(&name, p),
    };
    let all_sent = outcomes.iter().all(|(_, o)| o.is_ok());
    let lines: Vec<String> = outcomes
        .into_iter()
        .map(|(address, o)| match o {
            Ok(()) => format!("sent a test message to {address}"),
            Err(reply) => format!("{address}: refused: {reply}"),
        })
        .collect();
    let status = match all_sent {
        true => StatusCode::OK,
        false => StatusCode::BAD_GATEWAY,
    };
    done(status, &name, &format!("/campaigns/{id}"), &lines)
}

/// What the edit form posts; an empty field is left as it is.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct EditForm {
    pub subject: String,
    pub from: String,
    /// `markdown` or `html`: what [`Self::content`] is.
    pub format: String,
    pub content: String,
    pub send_at: String,
}

#[derive(Template)]
#[template(path = "admin/campaign_edit.html")]
struct EditPage<'a> {
    name: &'a str,
    path: String,
    /// The current subject and From, shown as the fields' placeholders.
    now: (String, String),
    f: &'a EditForm,
    csrf: &'a str,
    error: Option<(&'a str, &'static str)>,
}

impl EditPage<'_> {
    fn error_for(&self, field: &str) -> Option<&str> {
        self.error.filter(|(_, f)| *f == field).map(|(m, _)| m)
    }
}

async fn edit_page(
    state: &State,
    access: &Access,
    name: &str,
    f: &EditForm,
    error: Option<&str>,
) -> Response {
    let campaign = name.to_string();
    let now = state
        .admin
        .db(move |c| {
            let Some(found) = campaigns::find(c, &campaign).ok() else {
                return Ok(None);
            };
            let subject = content::latest(c, found.id)?.map_or(found.subject, |v| v.subject);
            Ok(Some((subject, found.from_addr)))
        })
        .await;
    let now = match now {
        Ok(Some(now)) => now,
        Ok(None) => return secure((StatusCode::NOT_FOUND, "no such campaign\n").into_response()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the campaign to edit");
            return secure(
                (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response(),
            );
        }
    };
    let csrf = access.csrf(state);
    let page = EditPage {
        name,
        now,
        path: path_segment(name),
        f,
        csrf: &csrf,
        error: error.map(|m| (m, field_of(m))),
    };
    rendered(&page, "the edit form")
}

/// `GET /campaigns/NAME/edit`.
async fn edit_form(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
) -> Response {
    let f = EditForm {
        format: "markdown".into(),
        ..EditForm::default()
    };
    edit_page(&state, &access, &name, &f, None).await
}

/// The edit as `campaign edit` takes it: content in files under `dir`.
fn edit_request(name: &str, f: &EditForm, dir: &Scratch) -> std::io::Result<EditRequest> {
    let given = |s: &str| Some(s.to_string()).filter(|s| !s.trim().is_empty());
    let mut req = EditRequest {
        name: name.to_string(),
        subject: given(&f.subject),
        from: given(&f.from),
        send_at: given(&f.send_at),
        ..EditRequest::default()
    };
    if !f.content.trim().is_empty() {
        match f.format.as_str() {
            "html" => req.html = Some(dir.file("content.html", &f.content)?),
            _ => req.markdown = Some(dir.file("content.md", &f.content)?),
        }
    }
    Ok(req)
}

/// `POST /campaigns/NAME/edit`: the campaign's page, or the form again
/// with the refusal beside its field.
async fn edit(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
    Form(f): Form<EditForm>,
) -> Response {
    let (shared, form, campaign) = (state.clone(), f.clone(), name.clone());
    let stored = blocking(&state, move |c| {
        let dir = Scratch::new().map_err(|e| Problem::internal(&e))?;
        let req = edit_request(&campaign, &form, &dir).map_err(|e| Problem::internal(&e))?;
        store_edit(c, &shared, &req).map_err(|e| readable(e, dir.0.as_path()))
    })
    .await;
    match stored {
        Ok(id) => Redirect::to(&format!("/campaigns/{id}")).into_response(),
        Err(p) => {
            let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY);
            with_status(
                edit_page(&state, &access, &name, &f, Some(&p.detail)).await,
                status,
            )
        }
    }
}
