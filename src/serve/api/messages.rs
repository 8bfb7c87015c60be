//! `/api/v1/messages`: one transactional message submitted (the same
//! [`crate::messages::submit`] as `mailsplit send`, idempotency decided by
//! the database) and read back.

use axum::extract::{Path, State as Extract};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{self, Need};
use super::problem::{Errors, Problem};
use super::subscribers::store_problem;
use super::Input;
use crate::messages::{self, MessageError, MessageView, Queue, Submit};
use crate::serve::State;

pub fn routes() -> OpenApiRouter<State> {
    OpenApiRouter::new()
        .routes(routes!(submit))
        .routes(routes!(get_one))
}

/// A message to send: a message template's name, the recipient (an
/// address or `Name <address>`) and the template's `data`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMessage {
    pub template: String,
    pub to: String,
    /// Any JSON object (at most 64 KB), `data.KEY` in the template.
    #[serde(default)]
    pub data: Option<serde_json::Value>,
}

/// What a submit answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    pub id: i64,
    /// `queued`, or `suppressed` for an address that bounced or
    /// complained (or unsubscribed, for a marketing-stream template).
    pub status: String,
}

/// A message and what became of it.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageOut {
    pub id: i64,
    pub template: String,
    pub to: String,
    /// queued, sent, failed, bounced or suppressed
    pub status: String,
    /// The relay's reply to a failed message, or why it was suppressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
}

impl From<MessageView> for MessageOut {
    fn from(m: MessageView) -> MessageOut {
        MessageOut {
            id: m.id,
            template: m.template,
            to: m.to,
            status: m.status.to_string(),
            reply: m.reply,
            created_at: m.created_at,
            sent_at: m.sent_at,
        }
    }
}

fn problem(e: MessageError) -> Problem {
    match e {
        MessageError::KeyReused(_) => Problem::new(StatusCode::CONFLICT, e.to_string()),
        MessageError::UnknownMessage(_) => Problem::not_found(e.to_string()),
        MessageError::Queue(_) => Problem::unavailable(),
        MessageError::Store(ref s) => store_problem(s),
        _ if e.is_usage() => Problem::unprocessable(e.to_string()),
        _ => Problem::internal(&e),
    }
}

/// Submit one message; 202 with its id. The same `Idempotency-Key` and
/// body give the same id and no second send; the key with another body
/// is 409. An address on the suppression list (by itself or its
/// @domain), or erased at its owner's request, is 422 and nothing is
/// stored (entries added later still stop the message when a worker
/// claims it: status `suppressed`).
#[utoipa::path(post, path = "/messages", operation_id = "send_message", tag = "messages",
    request_body = NewMessage,
    params(("Idempotency-Key" = Option<String>, Header, description = "the same key and body: the same message, sent once")),
    responses((status = 202, description = "queued (or suppressed: bounced or complained)", body = Accepted), Errors),
    security(("bearer" = [])))]
async fn submit(
    _: Need<auth::Send>,
    Extract(state): Extract<State>,
    headers: HeaderMap,
    Input(body): Input<NewMessage>,
) -> Result<(StatusCode, Json<Accepted>), Problem> {
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| Problem::bad_request("Idempotency-Key must be printable ASCII"))?
                .to_string(),
        ),
    };
    let settings = state.settings.clone();
    let queue = Queue {
        servers: settings.servers.clone(),
        tube: settings.tube.clone(),
    };
    let s = Submit {
        template: body.template,
        to: body.to,
        data: body.data,
        idempotency_key: key,
    };
    let done = state
        .api
        .dbs
        .run(move |c| Ok(messages::submit(c, &queue, s)))
        .await
        .map_err(|e| store_problem(&e))?
        .map_err(problem)?;
    let status = done.status.to_string();
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            id: done.id,
            status,
        }),
    ))
}

/// One message.
#[utoipa::path(get, path = "/messages/{id}", operation_id = "get_message", tag = "messages",
    params(("id" = i64, Path, description = "the id the submit answered")),
    responses((status = 200, description = "the message", body = MessageOut), Errors),
    security(("bearer" = [])))]
async fn get_one(
    _: Need<auth::ReadOrSend>,
    Extract(state): Extract<State>,
    Path(id): Path<i64>,
) -> Result<Json<MessageOut>, Problem> {
    state
        .admin
        .db(move |c| Ok(messages::get(c, id)))
        .await
        .map_err(|e| store_problem(&e))?
        .map(|m| Json(m.into()))
        .map_err(problem)
}
