//! `/subscribe` and `/confirm/TOKEN` on the public listener: a plain form
//! (labels, errors next to their fields, no script, no inline style, so
//! it works under `default-src 'none'`) and the confirmation page, whose
//! GET shows one button and changes nothing (mail scanners fetch links);
//! only its POST confirms. The stage is [`crate::audience::subscribe`].
//!
//! Abuse: a honeypot field (`website`, hidden from people; filled, the
//! answer is the same success page and nothing is stored), at most
//! [`PER_CLIENT`] POSTs per client address per [`WINDOW`], and the
//! stage's cap of confirmation mails per address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State as Extract};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::guard::Client;
use super::State;
use crate::audience::confirm_mail;
use crate::audience::subscribe::{self, Form, Mailer, SubscribeError};
use crate::messages::Queue;
use crate::store::lists::PublicList;

/// POSTs one client address may make per [`WINDOW`].
pub const PER_CLIENT: u32 = 20;
pub const WINDOW: Duration = Duration::from_secs(600);
/// Client addresses remembered at most (then the table starts afresh).
const MAX_CLIENTS: usize = 10_000;
/// Largest form body read.
const MAX_BODY: usize = 16 * 1024;
const MAX_TOKEN_LEN: usize = 64;

static CLIENTS: LazyLock<Mutex<HashMap<IpAddr, (Instant, u32)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

pub fn router() -> Router<State> {
    Router::new()
        .route("/subscribe", get(form_page).post(submit))
        .route("/confirm/{token}", get(confirm_page).post(confirm))
}

/// Whether `client` may make one more POST now.
fn allowed(client: IpAddr) -> bool {
    let Ok(mut map) = CLIENTS.lock() else {
        return true;
    };
    if map.len() >= MAX_CLIENTS {
        map.clear();
    }
    let now = Instant::now();
    let entry = map.entry(client).or_insert((now, 0));
    if now.duration_since(entry.0) > WINDOW {
        *entry = (now, 0);
    }
    entry.1 += 1;
    entry.1 <= PER_CLIENT
}

pub use super::chart::escape;

/// The sentence about `field`, above it, if the form was refused for it.
fn error_line(mistakes: &[(&'static str, String)], field: &str) -> String {
    mistakes
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, m)| {
            format!(
                "<p class=\"error\" id=\"{field}-error\"><strong>Error:</strong> {}</p>\n",
                escape(m)
            )
        })
        .unwrap_or_default()
}

/// The attributes that tie a refused field to its sentence.
fn described_by(mistakes: &[(&'static str, String)], field: &str) -> String {
    if mistakes.iter().any(|(f, _)| *f == field) {
        format!(" aria-invalid=\"true\" aria-describedby=\"{field}-error\"")
    } else {
        String::new()
    }
}

/// A checkbox per list, ticked when chosen before (or the only one).
fn list_boxes(lists: &[PublicList], form: &Form) -> String {
    let mut boxes = String::new();
    for l in lists {
        let checked = if form.lists.iter().any(|n| n == &l.name) || lists.len() == 1 {
            " checked"
        } else {
            ""
        };
        boxes.push_str(&format!(
            "<div><input type=\"checkbox\" name=\"list\" id=\"list-{id}\" value=\"{name}\"{checked}> \
             <label for=\"list-{id}\">{label}</label></div>\n",
            id = l.id,
            name = escape(&l.name),
            label = escape(l.label()),
        ));
    }
    boxes
}

/// The form's HTML: `action` is where it posts (`/subscribe` here, the
/// public URL's in `list form`).
pub fn form_html(
    action: &str,
    lists: &[PublicList],
    form: &Form,
    mistakes: &[(&'static str, String)],
) -> String {
    let error = |field: &str| error_line(mistakes, field);
    let described = |field: &str| described_by(mistakes, field);
    let boxes = list_boxes(lists, form);
    format!(
        "<form method=\"post\" action=\"{action}\">\n\
         {email_err}<p><label for=\"email\">Email address</label><br>\n\
         <input type=\"email\" id=\"email\" name=\"email\" required autocomplete=\"email\" value=\"{email}\"{email_aria}></p>\n\
         {name_err}<p><label for=\"name\">Name (optional)</label><br>\n\
         <input type=\"text\" id=\"name\" name=\"name\" autocomplete=\"name\" value=\"{name}\"{name_aria}></p>\n\
         <fieldset{list_aria}><legend>Lists</legend>\n{list_err}{boxes}</fieldset>\n\
         <div hidden><label for=\"website\">Leave this empty</label>\
         <input type=\"text\" id=\"website\" name=\"website\" tabindex=\"-1\" autocomplete=\"off\"></div>\n\
         <p><button type=\"submit\">Subscribe</button></p>\n</form>",
        action = escape(action),
        email_err = error("email"),
        email = escape(&form.email),
        email_aria = described("email"),
        name_err = error("name"),
        name = escape(&form.name),
        name_aria = described("name"),
        list_err = error("list"),
        list_aria = described("list"),
    )
}

pub(super) fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title></head>\n<body>\n<main>\n<h1>{title}</h1>\n{body}\n</main>\n</body>\n</html>\n",
        title = escape(title)
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; form-action 'self'; frame-ancestors 'none'",
            ),
            (header::HeaderName::from_static("x-robots-tag"), "noindex"),
        ],
        html,
    )
        .into_response()
}

pub(super) fn unavailable() -> Response {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Please try again",
        "<p>Your request could not be handled just now. Please try again in a few minutes.</p>",
    )
}

/// The one answer to every accepted form, known address or not.
fn check_inbox() -> Response {
    page(
        StatusCode::OK,
        "Check your inbox",
        "<p>Thank you. If a list you chose asks for a confirmation, we have sent you an email: \
         open it and press the button on the page its link opens.</p>",
    )
}

async fn form_page(Extract(state): Extract<State>) -> Response {
    match state.public.db(|c| Ok(subscribe::public_lists(c))).await {
        Ok(Ok(lists)) if lists.is_empty() => page(
            StatusCode::NOT_FOUND,
            "Subscribe",
            "<p>There is no list to subscribe to.</p>",
        ),
        Ok(Ok(lists)) => page(
            StatusCode::OK,
            "Subscribe",
            &form_html("/subscribe", &lists, &Form::default(), &[]),
        ),
        _ => unavailable(),
    }
}

/// The form's fields (`list` repeated) and whether the honeypot is filled.
fn parse(body: &[u8]) -> (Form, bool) {
    let mut form = Form::default();
    let mut honey = false;
    for (k, v) in url::form_urlencoded::parse(body) {
        match &*k {
            "email" => form.email = v.into_owned(),
            "name" => form.name = v.into_owned(),
            "list" => form.lists.push(v.into_owned()),
            "website" => honey |= !v.trim().is_empty(),
            _ => {}
        }
    }
    (form, honey)
}

/// What sends the confirmation mail: nothing without a public URL (the
/// mail's link would lead nowhere).
fn confirmation_mailer(state: &State) -> Option<Mailer> {
    state.settings.public_url.clone().map(|public_url| Mailer {
        queue: Queue {
            servers: state.settings.servers.clone(),
            tube: state.settings.tube.clone(),
        },
        from: state
            .settings
            .confirm_from
            .clone()
            .unwrap_or_else(|| confirm_mail::default_from(&public_url)),
        public_url,
        signer: state.identity.signer.clone(),
    })
}

async fn submit(Extract(state): Extract<State>, Client(client): Client, body: Bytes) -> Response {
    if !allowed(client) {
        return super::guard::too_many(client, "subscribe", WINDOW);
    }
    if body.len() > MAX_BODY {
        return page(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Subscribe",
            "<p>The form was too large.</p>",
        );
    }
    let (form, honey) = parse(&body);
    if honey {
        tracing::info!(client = %client, "subscribe: honeypot filled, nothing stored");
        return check_inbox();
    }
    let mailer = confirmation_mailer(&state);
    let asked = form.clone();
    let done = state
        .public
        .db(move |c| {
            let r = subscribe::subscribe(c, &asked, mailer.as_ref());
            let lists = match &r {
                Err(SubscribeError::Fields(_)) => subscribe::public_lists(c).unwrap_or_default(),
                _ => Vec::new(),
            };
            Ok((r, lists))
        })
        .await;
    match done {
        Ok((Ok(()), _)) => check_inbox(),
        Ok((Err(SubscribeError::Fields(mistakes)), lists)) => page(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Subscribe",
            &format!(
                "<p>Please correct the fields marked below.</p>\n{}",
                form_html("/subscribe", &lists, &form, &mistakes)
            ),
        ),
        Ok((Err(e), _)) => {
            tracing::warn!(error = %e, "subscribe failed");
            unavailable()
        }
        Err(e) => {
            tracing::warn!(error = %e, "subscribe failed");
            unavailable()
        }
    }
}

fn not_found() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Link not valid",
        "<p>This confirmation link is not valid or has expired (links last 7 days). \
         Please subscribe again.</p>",
    )
}

/// GET: one button that POSTs; changes nothing.
async fn confirm_page(Extract(state): Extract<State>, Path(token): Path<String>) -> Response {
    if token.len() > MAX_TOKEN_LEN {
        return not_found();
    }
    let signer = state.identity.signer.clone();
    match state
        .public
        .db(move |c| Ok(subscribe::pending(c, &signer, &token)))
        .await
    {
        Ok(Ok(Some(_))) => page(
            StatusCode::OK,
            "Confirm your subscription",
            "<p>Press the button to confirm that you want these emails.</p>\n\
             <form method=\"post\">\n<button type=\"submit\">Confirm</button>\n</form>",
        ),
        Ok(Ok(None)) => not_found(),
        _ => unavailable(),
    }
}

/// POST: confirm (idempotent).
async fn confirm(Extract(state): Extract<State>, Path(token): Path<String>) -> Response {
    if token.len() > MAX_TOKEN_LEN {
        return not_found();
    }
    let signer = state.identity.signer.clone();
    match state
        .public
        .db(move |c| Ok(subscribe::confirm(c, &signer, &token)))
        .await
    {
        Ok(Ok(true)) => page(
            StatusCode::OK,
            "Subscribed",
            "<p>Thank you: your subscription is confirmed.</p>",
        ),
        Ok(Ok(false)) => not_found(),
        _ => unavailable(),
    }
}
