//! The dashboard's subscriber pages: `GET /subscribers?q=PREFIX`, a
//! search by a prefix of the address (any case, indexed, paged by key:
//! [`crate::store::people::search`]); `GET /subscribers/EMAIL`, one
//! person: status, lists, attributes, what they were sent and what came of
//! it, transactional messages, bounces and complaints, each list bounded.
//! The forms on it post to [`people_actions`](super::people_actions).
//! Behind the admin gate, with every admin page's headers ([`secure`]);
//! no script.

use askama::Template;
use axum::extract::{Path, Query, State as Extract};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;

use super::auth::Access;
use super::page::{asset, path_segment};
use super::people_actions::{self as actions, failed, not_found, query_value, render};
use super::State;
use crate::clock::{rfc3339, Precision};
use crate::store::people::{self, Found, SentRow};
use crate::store::subscribers::{self, Subscriber};
use crate::store::{bounces, person, Conn, StoreError};

/// Results shown per page of the search.
pub const PAGE: i64 = 50;
/// Rows shown in each of the person page's tables.
pub const SHOWN: usize = 50;

/// The routes of these pages (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .route("/subscribers", get(search))
        .route("/static/people.css", get(stylesheet))
        .route("/subscribers/{email}", get(one))
        .route(
            "/subscribers/{email}/unsubscribe",
            post(actions::unsubscribe),
        )
        .route("/subscribers/{email}/remove", post(actions::remove))
        .route(
            "/subscribers/{email}/forget",
            get(actions::confirm).post(actions::forget),
        )
}

#[derive(Deserialize, Default)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
    after: Option<String>,
    /// Set after a forget: the key that was forgotten.
    forgotten: Option<String>,
}

/// One result with its link.
pub struct Hit {
    pub f: Found,
    pub path: String,
}

#[derive(Template)]
#[template(path = "admin/people.html")]
struct SearchPage<'a> {
    q: &'a str,
    hits: &'a [Hit],
    /// The link to the next page, when this one is full.
    next: Option<String>,
    forgotten: Option<&'a str>,
}

async fn stylesheet() -> Response {
    asset("text/css", include_str!("../../templates/admin/people.css"))
}

/// `GET /subscribers?q=PREFIX&after=KEY`.
async fn search(Extract(state): Extract<State>, Query(query): Query<SearchQuery>) -> Response {
    let q = query.q.trim().to_string();
    let hits = if q.is_empty() {
        Vec::new()
    } else {
        let (prefix, after) = (q.clone(), query.after.clone());
        let read = move |c: &mut Conn| people::search(c, &prefix, after.as_deref(), PAGE);
        match state.admin.db(read).await {
            Ok(found) => found,
            Err(e) => return failed(&e),
        }
    };
    let next = (hits.len() as i64 == PAGE)
        .then(|| hits.last())
        .flatten()
        .map(|last| format!("q={}&after={}", query_value(&q), query_value(&last.key)));
    let hits: Vec<Hit> = hits
        .into_iter()
        .map(|f| Hit {
            path: path_segment(&f.email),
            f,
        })
        .collect();
    render(SearchPage {
        q: &q,
        hits: &hits,
        next,
        forgotten: query.forgotten.as_deref(),
    })
}

/// One ledger row as the page shows it.
pub struct SentLine {
    pub s: SentRow,
    pub when: String,
}

/// A message (transactional, or a flow step) as the page shows it.
pub struct MessageLine {
    pub template: String,
    pub status: String,
    pub when: String,
    pub reply: String,
    /// Opens by a person, and clicks (0 when its template tracks nothing).
    pub opens: i64,
    pub clicks: i64,
}

/// Everything the person page shows.
pub struct PersonView {
    pub s: Subscriber,
    pub path: String,
    /// `key: value` of each attribute.
    pub attributes: Vec<(String, String)>,
    pub sent: Vec<SentLine>,
    pub messages: Vec<MessageLine>,
    pub bounces: Vec<bounces::Event>,
    pub shown: usize,
}

#[derive(Template)]
#[template(path = "admin/person.html")]
struct PersonPage<'a> {
    v: &'a PersonView,
    csrf: &'a str,
}

/// Read what the page shows about `email`; `None`: no such subscriber.
pub fn gather(conn: &mut Conn, email: &str) -> Result<Option<PersonView>, StoreError> {
    let Ok(key) = crate::mailbox::key(email.trim()) else {
        return Ok(None);
    };
    let Some(s) = subscribers::find(conn, &key)? else {
        return Ok(None);
    };
    let when = |ms: i64| rfc3339(ms, Precision::Seconds);
    let sent = people::sent(conn, s.id, SHOWN)?
        .into_iter()
        .map(|s| SentLine {
            when: when(s.at),
            s,
        })
        .collect();
    let messages = person::messages_to(conn, &key)?
        .iter()
        .rev()
        .take(SHOWN)
        .map(|m| MessageLine {
            template: m["template"].as_str().unwrap_or_default().to_string(),
            status: m["status"].as_str().unwrap_or_default().to_string(),
            when: when(m["created_at"].as_i64().unwrap_or_default()),
            reply: m["reply"].as_str().unwrap_or_default().to_string(),
            opens: m["opens"].as_i64().unwrap_or_default(),
            clicks: m["clicks"].as_i64().unwrap_or_default(),
        })
        .collect();
    let mut bounces = bounces::events_of(conn, s.id)?;
    bounces.reverse();
    bounces.truncate(SHOWN);
    let attributes =
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&s.attributes)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(text) => (k, text),
                other => (k, other.to_string()),
            })
            .collect();
    Ok(Some(PersonView {
        path: path_segment(&s.email),
        attributes,
        sent,
        messages,
        bounces,
        shown: SHOWN,
        s,
    }))
}

/// `GET /subscribers/EMAIL`.
async fn one(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(email): Path<String>,
) -> Response {
    let v = match state.admin.db(move |c| gather(c, &email)).await {
        Ok(Some(v)) => v,
        Ok(None) => return not_found(),
        Err(e) => return failed(&e),
    };
    let csrf = access.csrf(&state);
    render(PersonPage { v: &v, csrf: &csrf })
}
