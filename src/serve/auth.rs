//! Who may use the admin listener, and protection of its state-changing
//! requests against cross-site forgery.
//!
//! A request is let in with `Authorization: Bearer <MAILSPLIT_ADMIN_TOKEN>`
//! (scripts, Prometheus), or with the session cookie the login form sets
//! after it was given the same token (browsers). The cookie holds no
//! token: it is `EXPIRES.NONCE.MAC`, an HMAC under the admin token, and
//! the session must also be open in the database ([`sessions`]): so it
//! survives a restart of `serve`, ends for good at `POST /logout` (a copy
//! of the cookie kept elsewhere is refused from then on), and dies with a
//! change of the token (the MAC no longer matches, and `serve` drops the
//! older token's sessions when it starts). It is `HttpOnly` and
//! `SameSite=Strict`.
//!
//! Every POST (and any other method but GET and HEAD) must also prove it
//! was not forged by another site: either it carries the bearer header
//! (which a browser never attaches on its own, and which another site's
//! script cannot add without a CORS preflight this server never grants),
//! or the CSRF token of its session, as form field `csrf` (URL-encoded or
//! `multipart/form-data`) or header
//! `X-CSRF-Token`. A POST marked `Sec-Fetch-Site: cross-site` is refused
//! outright.
//!
//! Without a configured token the listener is loopback-only (see
//! `cli::serve_settings`) and open; it then answers only requests whose
//! `Host` is a loopback name, so a web page cannot reach it through a DNS
//! name rebound to 127.0.0.1, and POSTs still need the bearer header (any
//! value: its presence is what no cross-site request can have) or the
//! page's CSRF token, made with a random key of this process.

use askama::Template;
use axum::body::Body;
use axum::extract::{Request, State as Extract};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use data_encoding::BASE64URL_NOPAD;
use hmac::Mac;
use serde::Deserialize;

use super::cookie::{
    constant_time_eq, cookie_value, mac, new_session, read_session, session_id, token_fingerprint,
    COOKIE, SESSION_TTL,
};
use super::guard::{Client, Credential};
use super::State;
use crate::store::{now_ms, sessions};

/// Largest form body read to find its CSRF field: the campaign forms
/// carry a whole message's content, up to the API's own body limit.
const MAX_FORM: usize = 1024 * 1024;

/// How a request got in; handlers read it to put the right CSRF token
/// into the forms they render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// No token configured: a loopback-only listener.
    Open,
    /// The bearer header carried the token.
    Bearer,
    /// The session cookie, with the session's nonce.
    Session(String),
}

impl Access {
    /// The CSRF token forms rendered for this request must carry.
    pub fn csrf(&self, state: &State) -> String {
        let nonce = match self {
            Access::Session(nonce) => nonce.as_str(),
            Access::Open | Access::Bearer => "",
        };
        let tag = mac(state, "mailsplit admin csrf", nonce)
            .finalize()
            .into_bytes();
        BASE64URL_NOPAD.encode(&tag[..18])
    }

    fn csrf_ok(&self, state: &State, given: &str) -> bool {
        let Ok(tag) = BASE64URL_NOPAD.decode(given.as_bytes()) else {
            return false;
        };
        let nonce = match self {
            Access::Session(nonce) => nonce.as_str(),
            Access::Open | Access::Bearer => "",
        };
        tag.len() == 18
            && mac(state, "mailsplit admin csrf", nonce)
                .verify_truncated_left(&tag)
                .is_ok()
    }
}

/// Why a request is turned away.
enum Refusal<'a> {
    /// No credentials, or no valid session.
    Unauthorized,
    /// A bearer header with the wrong token (this one): counts as a failed
    /// login.
    WrongBearer(&'a str),
    /// An open listener asked under a name that is not loopback.
    NotLoopback,
}

/// Whether `host` (a `Host` header) names this machine's loopback.
fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        // `[::1]:8081`, `127.0.0.1:8081`, `localhost:8081`
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn authenticate<'a>(state: &State, headers: &'a HeaderMap) -> Result<Access, Refusal<'a>> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(expected) = state.settings.admin_token.as_deref() else {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return match (loopback_host(host), bearer) {
            (false, _) => Err(Refusal::NotLoopback),
            (true, Some(_)) => Ok(Access::Bearer),
            (true, None) => Ok(Access::Open),
        };
    };
    if let Some(given) = bearer {
        return if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            Ok(Access::Bearer)
        } else {
            Err(Refusal::WrongBearer(given))
        };
    }
    cookie_value(headers, COOKIE)
        .and_then(|v| read_session(state, v))
        .map(Access::Session)
        .ok_or(Refusal::Unauthorized)
}

/// Routes anyone may fetch: the login form and the stylesheet it uses.
fn is_public(path: &str) -> bool {
    matches!(path, "/login" | "/static/dashboard.css")
}

/// The admin listener's gate: see the module documentation.
pub async fn require_admin(Extract(state): Extract<State>, req: Request, next: Next) -> Response {
    if is_public(req.uri().path()) {
        return next.run(req).await;
    }
    let client = super::guard::client_of(
        req.extensions(),
        req.headers(),
        &state.settings.trusted_proxies,
    );
    // The right token or an open session gets in whatever others sent
    // from this address (see `guard`); only failures are refused.
    let access = match authenticate(&state, req.headers()) {
        Ok(Access::Session(nonce)) => match session_open(&state, &nonce).await {
            Ok(true) => Access::Session(nonce),
            Ok(false) => return unauthorized(&state, client, &req),
            Err(refused) => return refused,
        },
        Ok(access) => access,
        Err(Refusal::NotLoopback) => {
            return (
                StatusCode::FORBIDDEN,
                "this admin listener has no token and answers only to loopback names (127.0.0.1, localhost); set MAILSPLIT_ADMIN_TOKEN to reach it by another name\n",
            )
                .into_response()
        }
        Err(Refusal::Unauthorized) => return unauthorized(&state, client, &req),
        Err(Refusal::WrongBearer(given)) => {
            if let Some(wait) = state.failures.blocked(client, Credential::Admin, given) {
                return super::guard::too_many(client, "admin listener", wait);
            }
            state
                .failures
                .failed(client, Credential::Admin, "admin bearer header", given);
            return login_required(&req, None);
        }
    };
    let mut req = if matches!(*req.method(), Method::GET | Method::HEAD) {
        req
    } else {
        match check_forgery(&state, &access, req).await {
            Ok(req) => req,
            Err(refused) => return refused,
        }
    };
    req.extensions_mut().insert(access);
    next.run(req).await
}

/// Whether the session of a cookie with a valid MAC is still open (not
/// logged out, not of another token); 503 when the database cannot say.
async fn session_open(state: &State, nonce: &str) -> Result<bool, Response> {
    let id = session_id(nonce);
    let fp = token_fingerprint(state.settings.admin_token.as_deref());
    let now = now_ms();
    state
        .admin
        .db(move |c| sessions::alive(c, &id, &fp, now))
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot check an admin session");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response()
        })
}

/// No valid credentials: 401 (see [`login_required`]), or 429 to a client
/// that used up its failed logins.
fn unauthorized(state: &State, client: std::net::IpAddr, req: &Request) -> Response {
    if let Some(wait) = state.failures.client_blocked(client) {
        return super::guard::too_many(client, "admin listener", wait);
    }
    login_required(req, None)
}

/// Refuse a state-changing request that another site could have made.
async fn check_forgery(state: &State, access: &Access, req: Request) -> Result<Request, Response> {
    let forbidden = |why: &'static str| (StatusCode::FORBIDDEN, why).into_response();
    let headers = req.headers();
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return Err(forbidden("cross-site request refused\n"));
    }
    if *access == Access::Bearer {
        return Ok(req);
    }
    if let Some(given) = headers.get("x-csrf-token").and_then(|v| v.to_str().ok()) {
        return if access.csrf_ok(state, given) {
            Ok(req)
        } else {
            Err(forbidden("wrong CSRF token: reload the page\n"))
        };
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let is_form = content_type.starts_with("application/x-www-form-urlencoded");
    let upload = super::multipart::boundary(content_type);
    if !is_form && upload.is_none() {
        return Err(forbidden(
            "a POST needs the bearer token or the page's CSRF token\n",
        ));
    }
    // The form's own `csrf` field: read the (bounded) body, then hand it on.
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, "form too large\n").into_response());
    };
    let ok = match upload {
        Some(boundary) => super::multipart::parse(&boundary, &bytes)
            .unwrap_or_default()
            .iter()
            .find(|p| p.name == "csrf")
            .is_some_and(|p| access.csrf_ok(state, &String::from_utf8_lossy(&p.value))),
        None => url::form_urlencoded::parse(&bytes)
            .find(|(k, _)| k == "csrf")
            .is_some_and(|(_, v)| access.csrf_ok(state, &v)),
    };
    if !ok {
        return Err(forbidden("missing or wrong CSRF token: reload the page\n"));
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// 401: the login form for a browser, a short text for anything else.
fn login_required(req: &Request, error: Option<&str>) -> Response {
    let browser = req.method() == Method::GET
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/html"));
    if browser {
        return (StatusCode::UNAUTHORIZED, login_page(error)).into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "admin token required\n",
    )
        .into_response()
}

#[derive(Template)]
#[template(path = "admin/login.html")]
struct LoginPage<'a> {
    error: Option<&'a str>,
}

fn login_page(error: Option<&str>) -> Response {
    match (LoginPage { error }).render() {
        Ok(html) => super::page::secure(Html(html).into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot render the login page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

/// `GET /login`: the form (or, when there is no token to ask for, the
/// dashboard).
pub async fn login_form(Extract(state): Extract<State>) -> Response {
    if state.settings.admin_token.is_none() {
        return Redirect::to("/").into_response();
    }
    login_page(None)
}

#[derive(Deserialize)]
pub struct Login {
    token: String,
}

/// `POST /login`: the token for a session cookie.
pub async fn login(
    Extract(state): Extract<State>,
    Client(client): Client,
    Form(form): Form<Login>,
) -> Response {
    let Some(expected) = state.settings.admin_token.as_deref() else {
        return Redirect::to("/").into_response();
    };
    let given = form.token.trim();
    if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        if let Some(wait) = state.failures.blocked(client, Credential::Admin, given) {
            return super::guard::too_many(client, "admin login", wait);
        }
        state
            .failures
            .failed(client, Credential::Admin, "admin login form", given);
        let mut page = login_page(Some("That is not the admin token."));
        *page.status_mut() = StatusCode::UNAUTHORIZED;
        return page;
    }
    let (value, id, expires_at) = new_session(&state);
    let fp = token_fingerprint(Some(expected));
    let now = now_ms();
    let stored = state
        .admin
        .db(move |c| sessions::create(c, &id, &fp, now, expires_at))
        .await;
    if let Err(e) = stored {
        tracing::warn!(error = %e, "cannot record an admin session");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot log in: the database is unavailable; try again\n",
        )
            .into_response();
    }
    let cookie = format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    );
    set_cookie(Redirect::to("/").into_response(), &cookie)
}

/// `POST /logout`: end the session on the server (its cookie, wherever a
/// copy of it is, lets nobody in any more) and forget the cookie.
pub async fn logout(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
) -> Response {
    if let Access::Session(nonce) = access {
        let id = session_id(&nonce);
        if let Err(e) = state.admin.db(move |c| sessions::end(c, &id)).await {
            tracing::warn!(error = %e, "cannot end an admin session");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot log out: the database is unavailable, so the session is still open; try again\n",
            )
                .into_response();
        }
    }
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    set_cookie(Redirect::to("/login").into_response(), &cookie)
}

fn set_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names() {
        for ok in [
            "127.0.0.1:8081",
            "localhost:1",
            "LOCALHOST",
            "[::1]:8081",
            "127.9.9.9",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8081",
            "10.0.0.1:80",
            "",
            "127.0.0.1.evil.example",
            "[::2]:1",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; mailsplit_admin=x.y.z"),
        );
        assert_eq!(cookie_value(&h, COOKIE), Some("x.y.z"));
        assert_eq!(cookie_value(&h, "mailsplit"), None);
    }
}
