//! A recipient's own pages on the public listener: `/p/TOKEN`, the
//! preference centre (a plain form, no script, labels, under the same CSP
//! as `/subscribe`; GET shows, only POST changes, and saving twice is
//! harmless), and `/v/TOKEN`, view in browser (the message as it was sent
//! to them, under a CSP that forbids script). A token names one
//! (campaign, recipient) and is good for its own page only; anything else
//! gets the same 404, which says nothing about anyone. A message
//! template's mail (a flow step) has tokens of its own purposes, naming
//! the message. The stages are
//! [`crate::audience::preferences`] and [`crate::compose::view`].

use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::subscribe::{escape, page, unavailable};
use super::State;
use crate::audience::preferences::{self, Change, Page, PreferencesError, Via};
use crate::compose::view::Shown;
use crate::store::recipients::RecipientStatus;

const MAX_TOKEN_LEN: usize = 64;
/// Largest form body read.
const MAX_BODY: usize = 16 * 1024;

pub fn router() -> Router<State> {
    Router::new()
        .route("/p/{token}", get(show).post(save))
        .route("/v/{token}", get(view))
}

fn not_found() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Link not valid",
        "<p>This link is not valid. Please use the link in the email you received.</p>",
    )
}

/// The form of `p`, with `mistakes` next to their fields.
fn form_html(p: &Page, mistakes: &[(&'static str, String)]) -> String {
    let name_err = mistakes
        .iter()
        .find(|(f, _)| *f == "name")
        .map(|(_, m)| {
            format!(
                "<p class=\"error\" id=\"name-error\"><strong>Error:</strong> {}</p>\n",
                escape(m)
            )
        })
        .unwrap_or_default();
    let mut boxes = String::new();
    for (l, member) in &p.lists {
        boxes.push_str(&format!(
            "<div><input type=\"checkbox\" name=\"list\" id=\"list-{id}\" value=\"{name}\"{checked}> \
             <label for=\"list-{id}\">{label}</label></div>\n",
            id = l.id,
            name = escape(&l.name),
            checked = if *member { " checked" } else { "" },
            label = escape(l.label()),
        ));
    }
    let status = match p.status {
        RecipientStatus::Active => String::new(),
        s => format!(
            "<p id=\"status\">You are {}: no list's emails reach you.</p>\n",
            escape(s.as_str())
        ),
    };
    format!(
        "{status}<form method=\"post\">\n\
         {name_err}<p><label for=\"name\">Your name</label><br>\n\
         <input type=\"text\" id=\"name\" name=\"name\" autocomplete=\"name\" value=\"{name}\"></p>\n\
         <fieldset><legend>The lists you receive</legend>\n{boxes}</fieldset>\n\
         <p><input type=\"checkbox\" name=\"unsubscribe_all\" id=\"unsubscribe_all\" value=\"1\"> \
         <label for=\"unsubscribe_all\">Unsubscribe from all our emails</label></p>\n\
         <p><button type=\"submit\">Save</button></p>\n</form>",
        name = escape(&p.name),
    )
}

/// GET: the recipient's preferences; changes nothing.
async fn show(Extract(state): Extract<State>, Path(token): Path<String>) -> Response {
    let Some((_, recipient)) = read_preferences(&state, &token) else {
        return not_found();
    };
    match state
        .public
        .db(move |c| Ok(preferences::page(c, recipient)))
        .await
    {
        Ok(Ok(Some(p))) => page(StatusCode::OK, "Your preferences", &form_html(&p, &[])),
        Ok(Ok(None)) => not_found(),
        _ => unavailable(),
    }
}

/// The form's fields (`list` repeated).
fn parse(body: &[u8]) -> Change {
    let mut change = Change::default();
    for (k, v) in url::form_urlencoded::parse(body) {
        match &*k {
            "name" => change.name = v.into_owned(),
            "list" => change.keep.push(v.into_owned()),
            "unsubscribe_all" => change.unsubscribe_all |= !v.trim().is_empty(),
            _ => {}
        }
    }
    change
}

/// POST: save (idempotent), then show the page again.
async fn save(Extract(state): Extract<State>, Path(token): Path<String>, body: Bytes) -> Response {
    let Some(ids) = read_preferences(&state, &token) else {
        return not_found();
    };
    if body.len() > MAX_BODY {
        return page(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Your preferences",
            "<p>The form was too large.</p>",
        );
    }
    let change = parse(&body);
    let done = state
        .public
        .db(move |c| {
            let saved = preferences::save(c, ids, &change);
            let now = match &saved {
                Err(PreferencesError::Fields(_)) => preferences::page(c, ids.1).ok().flatten(),
                _ => None,
            };
            Ok((saved, now))
        })
        .await;
    match done {
        Ok((Ok(Some(p)), _)) => page(
            StatusCode::OK,
            "Your preferences",
            &format!("<p id=\"saved\">Saved.</p>\n{}", form_html(&p, &[])),
        ),
        Ok((Ok(None), _)) => not_found(),
        Ok((Err(PreferencesError::Fields(m)), Some(p))) => page(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Your preferences",
            &form_html(&p, &m),
        ),
        Ok((Err(e), _)) => {
            tracing::warn!(error = %e, "saving preferences failed");
            unavailable()
        }
        Err(e) => {
            tracing::warn!(error = %e, "saving preferences failed");
            unavailable()
        }
    }
}

/// The mail and recipient of a genuine preferences token: a campaign's,
/// or a message template's (a flow step).
fn read_preferences(state: &State, token: &str) -> Option<(Via, i64)> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let signer = &state.identity.signer;
    if let Some((campaign, recipient)) = signer.read_preferences(token) {
        return Some((Via::Campaign(campaign), recipient));
    }
    let (message, recipient) = signer.read_message_preferences(token)?;
    Some((Via::Message(message), recipient))
}

/// The message a genuine view token names.
fn read_view(state: &State, token: &str) -> Option<Shown> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let signer = &state.identity.signer;
    if let Some((campaign, recipient)) = signer.read_view(token) {
        return Some(Shown::Campaign(campaign, recipient));
    }
    signer.read_message_view(token).map(Shown::Message)
}

/// The CSP of a viewed message: images and inline style as a mail client
/// shows them; no script, no form, no frame, no plug-in.
const VIEW_CSP: &str =
    "default-src 'none'; img-src http: https: data:; style-src 'unsafe-inline'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// GET `/v/TOKEN`: the recipient's message as it was sent.
/// A fragment (or the text part) as a page of its own: the browser tab
/// and a screen reader get the subject as its title, and the language of
/// the page around it. A message that is a whole document is shown as sent.
fn document(subject: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title></head><body>{body}</body></html>\n",
        escape(subject)
    )
}

async fn view(Extract(state): Extract<State>, Path(token): Path<String>) -> Response {
    let Some(which) = read_view(&state, &token) else {
        return not_found();
    };
    let shown = state
        .public
        .db(move |c| Ok(crate::compose::view::shown(c, which)))
        .await;
    let (subject, rendered) = match shown {
        Ok(Ok(Some(sent))) => sent,
        Ok(Ok(None)) => return not_found(),
        Ok(Err(e)) => {
            tracing::warn!(?which, error = %e, "cannot show a message");
            return unavailable();
        }
        Err(e) => {
            tracing::warn!(?which, error = %e, "cannot show a message");
            return unavailable();
        }
    };
    let html = if rendered.html.trim().is_empty() {
        document(&subject, &format!("<pre>{}</pre>", escape(&rendered.text)))
    } else if !rendered.html.to_ascii_lowercase().contains("<html") {
        document(&subject, &rendered.html)
    } else {
        rendered.html
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CONTENT_SECURITY_POLICY, VIEW_CSP),
            (header::HeaderName::from_static("x-robots-tag"), "noindex"),
        ],
        html,
    )
        .into_response()
}
