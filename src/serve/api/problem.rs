//! RFC 9457 problem details: every `/api/v1` error is one of these, as
//! `application/problem+json`. [`as_problem`] turns whatever axum itself
//! answers (a JSON rejection, 404, 405) into one, so no error of this API
//! is plain text.

use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The content type of every error.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// Largest error body from axum that is read to carry its reason along.
const MAX_REASON: usize = 4096;

/// An error of the API (RFC 9457).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem (`about:blank`: the status says it).
    #[serde(rename = "type")]
    pub kind: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request; never echoes a key or password.
    pub detail: String,
    /// Seconds to wait (429 only; also the `Retry-After` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Problem {
        Problem {
            kind: "about:blank".into(),
            title: status.canonical_reason().unwrap_or("Error").into(),
            status: status.as_u16(),
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, detail)
    }

    pub fn unprocessable(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }

    pub fn unavailable() -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database or beanstalkd is unavailable; try again",
        )
    }

    /// 429, waiting `secs` seconds (at least 1).
    pub fn too_many(detail: impl Into<String>, secs: u64) -> Problem {
        let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, detail);
        p.retry_after = Some(secs.max(1));
        p
    }

    /// An internal failure, logged here; the client hears no more than
    /// that it happened.
    pub fn internal(error: &dyn std::fmt::Display) -> Problem {
        tracing::warn!(error = %error, "api: internal error");
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error; see the server's log",
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut res = (status, body).into_response();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

impl From<JsonRejection> for Problem {
    fn from(rejection: JsonRejection) -> Problem {
        let status = match rejection.status() {
            // A body that parses but does not fit the schema is a bad
            // field (DESIGN: 400), not axum's 422.
            StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
            s => s,
        };
        let detail = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "the body is over 1 MiB".to_string(),
            _ => rejection.body_text(),
        };
        Problem::new(status, detail)
    }
}

/// Middleware of the API's routes: an error response that is not problem
/// details yet (axum's own 404, 405, 415, path rejections) becomes one,
/// keeping its status and its text as the detail.
pub async fn as_problem(res: Response) -> Response {
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return res;
    }
    let (parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, MAX_REASON)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let detail = match (status, text.is_empty()) {
        (StatusCode::NOT_FOUND, _) => "no such route in /api/v1; see /api/v1/openapi.json".into(),
        (StatusCode::METHOD_NOT_ALLOWED, _) => "method not allowed on this route".into(),
        (_, true) => status.canonical_reason().unwrap_or("error").to_string(),
        (_, false) => text,
    };
    let mut fixed = Problem::new(status, detail).into_response();
    if let Some(allow) = parts.headers.get(header::ALLOW) {
        fixed.headers_mut().insert(header::ALLOW, allow.clone());
    }
    fixed
}

/// The error responses every route documents (all problem details).
pub struct Errors;

impl utoipa::IntoResponses for Errors {
    fn responses() -> std::collections::BTreeMap<
        String,
        utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
    > {
        use utoipa::openapi::header::Header;
        use utoipa::openapi::schema::{ObjectBuilder, Ref, Type};
        use utoipa::openapi::{ContentBuilder, ResponseBuilder};
        let codes = [
            (400, "bad JSON, or a field that is not valid"),
            (401, "no key, or a key that is wrong or revoked"),
            (403, "the key lacks the scope this route needs"),
            (404, "no such subscriber, campaign or route"),
            (405, "method not allowed on this route"),
            (
                409,
                "the state forbids it (the name exists, the campaign is cancelled)",
            ),
            (413, "the body is over 1 MiB"),
            (415, "the body is not application/json"),
            (
                422,
                "meaningful but refused (bad template, unknown list, not yet supported)",
            ),
            (
                429,
                "rate limit or failed attempts: wait Retry-After seconds",
            ),
            (503, "the database or beanstalkd is unavailable"),
        ];
        codes
            .into_iter()
            .map(|(code, why)| {
                let content = ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build();
                let mut res = ResponseBuilder::new()
                    .description(why)
                    .content(PROBLEM_JSON, content);
                if code == 429 {
                    res = res.header(
                        "Retry-After",
                        Header::new(ObjectBuilder::new().schema_type(Type::Integer)),
                    );
                }
                (code.to_string(), res.build().into())
            })
            .collect()
    }
}
