//! `GET /suppression[?after=ENTRY]`: the suppression list a page at a
//! time, in order (as `suppress ls`); `POST /suppression` adds entries as
//! `suppress add` does, `POST /suppression/remove` removes them as
//! `suppress rm`, `POST /suppression/import` takes pasted lines or CSV as
//! `suppress import` takes a file (the admin form limit, 16 KiB, bounds
//! it: a bigger file goes through the CLI).

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Query, State as Extract};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;

use super::{refusal_status, render, stage, Fields};
use crate::audience::suppress::{self, ImportCounts, SuppressError};
use crate::clock::{rfc3339, Precision};
use crate::serve::auth::Access;
use crate::serve::State;

/// Entries shown per page.
pub const PAGE: i64 = 100;

pub fn routes() -> Router<State> {
    Router::new()
        .route("/suppression", get(page).post(add))
        .route("/suppression/remove", post(remove))
        .route("/suppression/import", post(import))
}

/// One entry's row.
pub struct Row {
    pub entry: String,
    pub reason: String,
    pub created: String,
}

#[derive(Template)]
#[template(path = "admin/suppression.html")]
struct Page<'a> {
    csrf: &'a str,
    rows: &'a [Row],
    /// The query string of the next page, when there is one.
    next: Option<String>,
    /// What the last form did, in a sentence.
    done: Option<String>,
    /// Why the last form was refused, and which form (`add`, `import`).
    error: Option<(&'static str, String)>,
}

#[derive(Deserialize, Default)]
pub struct At {
    after: Option<String>,
}

struct Outcome {
    status: StatusCode,
    done: Option<String>,
    error: Option<(&'static str, String)>,
}

async fn show(state: &State, access: &Access, after: Option<String>, o: Outcome) -> Response {
    let read = stage(state, move |c| {
        suppress::page(c, after.as_deref(), PAGE + 1)
    })
    .await;
    let mut all = match read {
        Ok(Ok(all)) => all,
        Ok(Err(e)) => return super::unavailable(&e),
        Err(r) => return r,
    };
    // One entry more than shown says whether a next page exists.
    let next = (all.len() as i64 > PAGE).then(|| {
        all.truncate(PAGE as usize);
        let last = all.last().map(|s| s.entry.as_str()).unwrap_or_default();
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("after", last)
            .finish()
    });
    let rows: Vec<Row> = all
        .into_iter()
        .map(|s| Row {
            created: rfc3339(s.created_at, Precision::Seconds),
            entry: s.entry,
            reason: s.reason,
        })
        .collect();
    let csrf = access.csrf(state);
    let page = Page {
        csrf: &csrf,
        rows: &rows,
        next,
        done: o.done,
        error: o.error,
    };
    render(o.status, page)
}

/// `GET /suppression`.
async fn page(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Query(at): Query<At>,
) -> Response {
    let ok = Outcome {
        status: StatusCode::OK,
        done: None,
        error: None,
    };
    show(&state, &access, at.after, ok).await
}

/// Entries as typed: split on white space and commas.
fn entries(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

async fn refused(state: &State, access: &Access, form: &'static str, e: SuppressError) -> Response {
    let o = Outcome {
        status: refusal_status(e.is_usage()),
        done: None,
        error: Some((form, e.to_string())),
    };
    show(state, access, None, o).await
}

/// `POST /suppression` (`entries`, `reason`).
async fn add(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let form = Fields::parse(&body);
    let (texts, reason) = (entries(&form.one("entries")), reason(&form));
    match stage(&state, move |c| suppress::add(c, &texts, &reason)).await {
        Ok(Ok(_)) => Redirect::to("/suppression").into_response(),
        Ok(Err(e)) => refused(&state, &access, "add", e).await,
        Err(r) => r,
    }
}

/// The form's reason (empty, as the CLI's default, when none is given).
fn reason(form: &Fields) -> String {
    form.one("reason")
}

/// `POST /suppression/remove` (`entry`).
async fn remove(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let texts = entries(&Fields::parse(&body).one("entry"));
    match stage(&state, move |c| suppress::remove(c, &texts)).await {
        Ok(Ok(_)) => Redirect::to("/suppression").into_response(),
        Ok(Err(e)) => refused(&state, &access, "remove", e).await,
        Err(r) => r,
    }
}

/// `POST /suppression/import` (`file`: the pasted lines, `reason`).
async fn import(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Response {
    let form = Fields::parse(&body);
    let (text, reason) = (form.one("file"), reason(&form));
    let run =
        move |c: &mut _| suppress::import_from(c, text.as_bytes(), "the pasted list", &reason);
    match stage(&state, run).await {
        Ok(Ok(n)) => {
            let o = Outcome {
                status: StatusCode::OK,
                done: Some(said(&n)),
                error: None,
            };
            show(&state, &access, None, o).await
        }
        Ok(Err(e)) => refused(&state, &access, "import", e).await,
        Err(r) => r,
    }
}

/// What an import did, as `suppress import` says it.
fn said(n: &ImportCounts) -> String {
    let mut s = format!(
        "read {} entries: {} added, {} already on the list, {} bad lines skipped",
        n.read, n.added, n.already, n.bad
    );
    for (line, text) in &n.bad_lines {
        s.push_str(&format!(
            "; line {line}: not an address or @domain: {text:?}"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_entries_split_on_space_and_commas() {
        assert_eq!(
            entries(" a@x.org, @y.org\nb@z.org,,"),
            ["a@x.org", "@y.org", "b@z.org"]
        );
    }
}
