//! Pause, resume and cancel from the admin listener, for the dashboard's
//! buttons and the JSON API alike: the same call as the CLI's, and one
//! mapping of its refusals to HTTP statuses.

use axum::http::StatusCode;

use super::State;
use crate::campaign::control::{self, Controlled};
use crate::store::campaigns::Control;
use crate::store::{Conn, StoreError};

/// `pause`, `resume` or `cancel`.
pub fn parse_action(action: &str) -> Option<Control> {
    action.parse().ok()
}

/// Why a control request did nothing, as an HTTP status and a message.
pub struct ControlFailure {
    pub status: StatusCode,
    pub message: String,
}

/// Pause, resume or cancel exactly as the CLI does ([`control::control`],
/// including the resume's kick of delayed jobs), on a connection of its
/// own: a resume waits for the workers' flag refresh, and the dashboard's
/// reads should not wait behind it.
pub async fn run_control(
    state: &State,
    client: std::net::IpAddr,
    name: &str,
    action: Control,
) -> Result<Controlled, ControlFailure> {
    let settings = state.settings.clone();
    let campaign = name.to_string();
    let done = state
        .admin
        .pool
        .blocking(move || {
            let mut conn = Conn::open(&settings.database_url)?;
            control::control(
                &mut conn,
                &settings.servers,
                &settings.tube,
                &campaign,
                action,
            )
        })
        .await
        .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())));
    match done {
        Ok(done) => {
            tracing::info!(client = %client, campaign = %done.campaign.name, ?action, "campaign controlled from the admin listener");
            Ok(done)
        }
        Err(e) => {
            let status = match &e {
                StoreError::UnknownCampaign(_) => StatusCode::NOT_FOUND,
                StoreError::IllegalTransition { .. } => StatusCode::CONFLICT,
                e if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            if status.is_server_error() {
                tracing::warn!(client = %client, error = %e, "cannot control campaign");
            } else {
                tracing::info!(client = %client, campaign = %name, ?action, "refused: {e}");
            }
            Err(ControlFailure {
                status,
                message: e.to_string(),
            })
        }
    }
}
