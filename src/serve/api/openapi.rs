//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 document, made by utoipa
//! from the handlers' `#[utoipa::path]` and their types. It needs no key:
//! it describes the routes, not the data, and a client fetches it before
//! it has one.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::serve::State;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "mailsplit API",
        description = "The shop's application talks to mailsplit: subscribers, campaigns and transactional messages. Errors are RFC 9457 problem details.",
        version = "1"
    ),
    components(schemas(super::Problem)),
    tags(
        (name = "subscribers", description = "People and their lists"),
        (name = "campaigns", description = "Create, enqueue, pause, resume, cancel, status"),
        (name = "messages", description = "Transactional messages: send one, read it back"),
        (name = "meta", description = "This document"),
    )
)]
struct Base;

/// The document's fixed part: info, tags, shared schemas.
pub fn base() -> Document {
    Base::openapi()
}

/// The document with the bearer scheme every route names.
pub fn finish(mut doc: Document) -> Document {
    let components = doc.components.get_or_insert_with(Default::default);
    let mut http = Http::new(HttpAuthScheme::Bearer);
    http.description = Some(
        "An API key (`mailsplit apikey create`) or MAILSPLIT_ADMIN_TOKEN, which holds every scope"
            .into(),
    );
    components.add_security_scheme("bearer", SecurityScheme::Http(http));
    doc
}

/// The finished document as served, made once by [`super::router`].
static JSON: OnceLock<String> = OnceLock::new();

/// Keep the finished document for [`openapi_json`].
pub fn publish(doc: &Document) -> Result<(), serde_json::Error> {
    let json = doc.to_json()?;
    let _ = JSON.set(json);
    Ok(())
}

pub fn routes() -> OpenApiRouter<State> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// This document (OpenAPI 3.1). No key needed.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "meta",
    responses((status = 200, description = "the OpenAPI document", body = Object)),
    security(()))]
async fn openapi_json() -> Response {
    match JSON.get() {
        Some(json) => ([(header::CONTENT_TYPE, "application/json")], json.clone()).into_response(),
        None => super::Problem::internal(&"the OpenAPI document was not made").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Every route but this document's own names the bearer scheme and
    /// documents its errors as problem details: a route added without
    /// them fails here before the fuzzer meets it.
    #[test]
    fn every_route_has_the_bearer_scheme_and_problem_errors() {
        let doc: Value = serde_json::to_value(super::super::document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.len() >= 7, "{paths:?}");
        for (path, ops) in paths {
            for (method, op) in ops.as_object().unwrap() {
                if path == "/api/v1/openapi.json" {
                    continue;
                }
                let id = format!("{method} {path}");
                assert_eq!(op["security"][0]["bearer"], serde_json::json!([]), "{id}");
                for code in ["400", "401", "403", "413", "429"] {
                    let content = &op["responses"][code]["content"];
                    assert!(
                        content["application/problem+json"].is_object(),
                        "{id} {code}"
                    );
                }
                assert!(
                    op["responses"]["429"]["headers"]["Retry-After"].is_object(),
                    "{id}"
                );
            }
        }
    }
}
