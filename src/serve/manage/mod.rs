//! The dashboard's management pages: API keys ([`keys`]), webhooks
//! ([`hooks`]), the suppression list ([`suppression`]), DKIM keys
//! ([`dkim`]), message templates ([`message_templates`]) and lists
//! ([`lists`]). Each form posts
//! to the stage function its CLI command calls (`apikey`, `webhook`,
//! `suppress`), so validation and wording live in the stage once; a
//! refusal is shown next to the form it came from. Behind the admin gate
//! (session or bearer token, CSRF proof on every POST), with every admin
//! page's headers ([`secure`]). A secret (a new API key, a generated
//! webhook secret) is shown once, in the answer to the POST that made it,
//! on a page that is never cached.

pub mod dkim;
pub mod hooks;
pub mod keys;
pub mod lists;
pub mod message_templates;
pub mod suppression;

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Router;

use super::page::secure;
use super::State;
use crate::store::{Conn, StoreError};

/// The routes of these pages (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .merge(keys::routes())
        .merge(hooks::routes())
        .merge(suppression::routes())
        .merge(dkim::routes())
        .merge(lists::routes())
        .merge(message_templates::routes())
}

/// A page with `status`; a template that fails to render is a 500.
pub fn render(status: StatusCode, page: impl Template) -> Response {
    match page.render() {
        Ok(html) => {
            let mut r = secure(Html(html).into_response());
            *r.status_mut() = status;
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot render a management page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

/// The database could not be reached: said once, the cause logged.
pub fn unavailable(e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "cannot reach the database for a management page");
    secure((StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response())
}

/// Run stage function `f` on the admin connection; the stage's own error
/// stays for the page to show, a lost database becomes the 503 answer.
pub async fn stage<T, E, F>(state: &State, f: F) -> Result<Result<T, E>, Response>
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce(&mut Conn) -> Result<T, E> + Send + 'static,
{
    state
        .admin
        .db(move |c| Ok::<_, StoreError>(f(c)))
        .await
        .map_err(|e| unavailable(&e))
}

/// The answer to a refused form: 422 for what the user can fix, 503 when
/// the stage could not reach the database.
pub fn refusal_status(usage: bool) -> StatusCode {
    if usage {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// A posted form's fields, in order (a name may repeat, as a checkbox
/// group's does).
pub struct Fields(Vec<(String, String)>);

impl Fields {
    pub fn parse(body: &[u8]) -> Fields {
        Fields(url::form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of `name`, trimmed; empty when absent.
    pub fn one(&self, name: &str) -> String {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Whether checkbox `name` was ticked.
    pub fn ticked(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_fields_are_all_kept() {
        let f = Fields::parse(b"csrf=x&scope=send&scope=read&name=+app+&local=on");
        assert_eq!(f.all("scope"), ["send", "read"]);
        assert_eq!(f.one("name"), "app");
        assert_eq!(f.one("missing"), "");
        assert!(f.ticked("local") && !f.ticked("other"));
    }
}
