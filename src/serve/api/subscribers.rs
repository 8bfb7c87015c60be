//! `/api/v1/subscribers`: add or update one person (the import's rules:
//! see [`store::subscribers`]), read, change and forget them.

use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{self, Need};
use super::problem::{Errors, Problem};
use super::Input;
use crate::audience::subscriber::{self, SubscriberError};
use crate::serve::State;
use crate::store::imports::Row;
use crate::store::recipients::RecipientStatus;
use crate::store::subscribers::Upserted;
use crate::store::{optouts, subscribers, StoreError};

/// Lists one request may name at most.
const MAX_LISTS: usize = 100;
/// Longest list name or subscriber name.
const MAX_NAME: usize = 256;

pub fn routes() -> OpenApiRouter<State> {
    OpenApiRouter::new()
        .routes(routes!(upsert))
        .routes(routes!(get_one, patch, forget))
}

/// A person to add or update.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSubscriber {
    #[schema(format = Email, example = "ada@example.test")]
    pub email: String,
    /// Omitted: a new subscriber has none, a known one keeps theirs.
    pub name: Option<String>,
    /// Merged key by key into what is stored; a `null` value removes its key.
    #[schema(value_type = Option<Object>)]
    pub attributes: Option<Map<String, Value>>,
    /// Lists to add the person to (created if new); at least one.
    #[schema(example = json!(["news"]))]
    pub lists: Vec<String>,
    /// Not yet supported: `true` is refused with 422 (nothing is written).
    pub double_opt_in: Option<bool>,
}

/// Changes to a known subscriber; omitted fields stay as they are.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriberPatch {
    pub name: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub attributes: Option<Map<String, Value>>,
    /// Only `unsubscribed`: nobody is made active again through the API.
    pub status: Option<PatchStatus>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PatchStatus {
    Unsubscribed,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Active,
    Unsubscribed,
    Bounced,
}

impl From<RecipientStatus> for Status {
    fn from(s: RecipientStatus) -> Status {
        match s {
            RecipientStatus::Active => Status::Active,
            RecipientStatus::Unsubscribed => Status::Unsubscribed,
            RecipientStatus::Bounced => Status::Bounced,
        }
    }
}

/// A subscriber.
#[derive(Debug, Serialize, ToSchema)]
pub struct Subscriber {
    pub email: String,
    pub name: String,
    #[schema(value_type = Object)]
    pub attributes: Value,
    pub status: Status,
    /// Names of the lists the subscriber is on.
    pub lists: Vec<String>,
    /// RFC 3339; `null` for subscribers an import created.
    pub created_at: Option<String>,
}

impl From<subscribers::Subscriber> for Subscriber {
    fn from(s: subscribers::Subscriber) -> Subscriber {
        Subscriber {
            email: s.email,
            name: s.name,
            attributes: serde_json::from_str(&s.attributes)
                .unwrap_or_else(|_| Value::Object(Map::new())),
            status: s.status.into(),
            lists: s.lists,
            created_at: s
                .created_at
                .map(|ms| crate::clock::rfc3339(ms, crate::clock::Precision::AsNeeded)),
        }
    }
}

/// A store failure as the client sees it.
pub fn store_problem(e: &StoreError) -> Problem {
    if e.is_transient() {
        tracing::warn!(error = %e, "api: database unavailable");
        return Problem::unavailable();
    }
    Problem::internal(e)
}

fn check_name(what: &str, name: &str) -> Result<(), Problem> {
    if name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(Problem::bad_request(format!(
            "{what} must be at most {MAX_NAME} characters, without control characters"
        )));
    }
    Ok(())
}

fn row_of(body: NewSubscriber) -> Result<(Row, Vec<String>), Problem> {
    let email = crate::audience::import::normalise_email(body.email.trim())
        .map_err(Problem::bad_request)?;
    let email_key = crate::mailbox::key(&email).map_err(|e| Problem::bad_request(e.to_string()))?;
    if body.lists.is_empty() || body.lists.len() > MAX_LISTS {
        return Err(Problem::bad_request(format!(
            "`lists` must name 1 to {MAX_LISTS} lists"
        )));
    }
    let mut lists = Vec::new();
    for list in body.lists {
        let list = list.trim().to_string();
        if list.is_empty() {
            return Err(Problem::bad_request("a list name is empty"));
        }
        check_name("a list name", &list)?;
        if !lists.contains(&list) {
            lists.push(list);
        }
    }
    if let Some(name) = &body.name {
        check_name("`name`", name)?;
    }
    let row = Row {
        line: 1,
        email,
        email_key,
        name: body.name,
        attributes: body.attributes.unwrap_or_default(),
        status: None,
        new_id: None,
    };
    Ok((row, lists))
}

/// Add a subscriber to lists, or update a known one. The import's rules
/// hold: an unsubscribed or bounced address stays so.
#[utoipa::path(post, path = "/subscribers", operation_id = "add_subscriber", tag = "subscribers",
    request_body = NewSubscriber,
    responses(
        (status = 201, description = "a new subscriber", body = Subscriber),
        (status = 200, description = "a known subscriber, updated (or unchanged)", body = Subscriber),
        Errors,
    ),
    security(("bearer" = [])))]
async fn upsert(
    _: Need<auth::Subscribers>,
    Extract(state): Extract<State>,
    Input(body): Input<NewSubscriber>,
) -> Result<(StatusCode, Json<Subscriber>), Problem> {
    if body.double_opt_in == Some(true) {
        return Err(Problem::unprocessable(
            "double opt-in is not supported yet: add the subscriber without it, or send your own confirmation first",
        ));
    }
    let (row, lists) = row_of(body)?;
    let written = state
        .admin
        .db(move |c| {
            let done = subscribers::upsert(c, &row, &lists)?;
            Ok((done, subscribers::find(c, &row.email_key)?))
        })
        .await
        .map_err(|e| store_problem(&e))?;
    match written {
        (Upserted::Forgotten, _) => Err(Problem::unprocessable(
            "this address was erased at its owner's request: it cannot be added through the API or an import; \
             the person can come back by confirming a double-opt-in sign-up (/subscribe)",
        )),
        (Upserted::New, Some(s)) => Ok((StatusCode::CREATED, Json(s.into()))),
        (Upserted::Known, Some(s)) => Ok((StatusCode::OK, Json(s.into()))),
        (_, None) => Err(Problem::internal(&"the subscriber just written is gone")),
    }
}

/// The subscriber with this address (any spelling of the mailbox).
async fn find(state: &State, email: &str) -> Result<subscribers::Subscriber, Problem> {
    let unknown = || Problem::not_found("no subscriber with this address");
    let key = crate::mailbox::key(email.trim()).map_err(|_| unknown())?;
    state
        .admin
        .db(move |c| subscribers::find(c, &key))
        .await
        .map_err(|e| store_problem(&e))?
        .ok_or_else(unknown)
}

/// One subscriber.
#[utoipa::path(get, path = "/subscribers/{email}", operation_id = "get_subscriber", tag = "subscribers",
    params(("email" = String, Path, description = "the subscriber's address", example = "ada@example.test")),
    responses((status = 200, description = "the subscriber", body = Subscriber), Errors),
    security(("bearer" = [])))]
async fn get_one(
    _: Need<auth::Read>,
    Extract(state): Extract<State>,
    Path(email): Path<String>,
) -> Result<Json<Subscriber>, Problem> {
    Ok(Json(find(&state, &email).await?.into()))
}

/// Change a subscriber's name or attributes, or unsubscribe them.
#[utoipa::path(patch, path = "/subscribers/{email}", operation_id = "patch_subscriber", tag = "subscribers",
    params(("email" = String, Path, description = "the subscriber's address", example = "ada@example.test")),
    request_body = SubscriberPatch,
    responses((status = 200, description = "the subscriber afterwards", body = Subscriber), Errors),
    security(("bearer" = [])))]
async fn patch(
    _: Need<auth::Subscribers>,
    Extract(state): Extract<State>,
    Path(email): Path<String>,
    Input(body): Input<SubscriberPatch>,
) -> Result<Json<Subscriber>, Problem> {
    if let Some(name) = &body.name {
        check_name("`name`", name)?;
    }
    let found = find(&state, &email).await?;
    let key = crate::mailbox::key(&found.email).map_err(|e| Problem::internal(&e))?;
    let id = found.id;
    let after = state
        .admin
        .db(move |c| {
            let changes = body.attributes.unwrap_or_default();
            subscribers::patch(c, id, body.name.as_deref(), &changes)?;
            if let Some(PatchStatus::Unsubscribed) = body.status {
                optouts::set_unsubscribed(c, id, "api")?;
            }
            subscribers::find(c, &key)
        })
        .await
        .map_err(|e| store_problem(&e))?;
    after
        .map(|s| Json(s.into()))
        .ok_or_else(|| Problem::not_found("no subscriber with this address"))
}

/// Forget a person (GDPR art. 17), as `mailsplit subscriber forget`:
/// name, attributes, memberships, engagement, sign-ups and the address in
/// every ledger are erased (counters stay exact); a keyed hash of the
/// address stays, so no import or API call adds it again, only the
/// person confirming a double-opt-in sign-up. 204 also for an address
/// nothing was held about (it is blocked all the same), so a retry is
/// harmless.
#[utoipa::path(delete, path = "/subscribers/{email}", operation_id = "forget_subscriber", tag = "subscribers",
    params(("email" = String, Path, description = "the subscriber's address", example = "ada@example.test")),
    responses((status = 204, description = "forgotten"), Errors),
    security(("bearer" = [])))]
async fn forget(
    _: Need<auth::Subscribers>,
    Extract(state): Extract<State>,
    Path(email): Path<String>,
) -> Result<StatusCode, Problem> {
    let done = state
        .admin
        .db(move |c| Ok(subscriber::forget(c, &email)))
        .await
        .map_err(|e| store_problem(&e))?;
    match done {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(SubscriberError::BadEmail(_)) => {
            Err(Problem::not_found("no subscriber with this address"))
        }
        Err(SubscriberError::Store(e)) => Err(store_problem(&e)),
        Err(e) => Err(Problem::internal(&e)),
    }
}
