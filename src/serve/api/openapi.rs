//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 document, made by utoipa
//! from the handlers' `#[utoipa::path]` and their types. It needs no key:
//! it describes the routes, not the data, and a client fetches it before
//! it has one.

use std::sync::Arc;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "mailsplit API",
        description = "The shop's application talks to mailsplit: subscribers and campaigns. Errors are RFC 9457 problem details.",
        version = "1"
    ),
    components(schemas(super::Problem)),
    tags(
        (name = "subscribers", description = "People and their lists"),
        (name = "campaigns", description = "Create, enqueue, pause, resume, cancel, status"),
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

pub async fn serve(doc: Arc<Document>) -> Response {
    match doc.to_json() {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => super::Problem::internal(&e).into_response(),
    }
}
