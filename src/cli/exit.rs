//! Exit codes: 0 success, 1 runtime failure, 2 usage error (DESIGN.md), and
//! 0 for a closed stdout (`mailsplit status | head -1`, as ripgrep does).
//!
//! Every error a command can return is a variant of [`CliError`], and every
//! variant's type implements [`ExitKind`]: a command that meets a new error
//! type does not compile until the type says whether it is the user's
//! mistake, so nothing falls through to exit 1 unnoticed.

use std::process::ExitCode;

use crate::audience::import::ImportError;
use crate::audience::lists::ListError;
use crate::audience::optouts::OptoutError;
use crate::audience::subscriber::SubscriberError;
use crate::audience::suppress::SuppressError;
use crate::campaign::CampaignError;
use crate::compose::ComposeError;
use crate::config::ConfigError;
use crate::dkim::{DkimError, KeygenError};
use crate::enqueue::requeue::RequeueError;
use crate::enqueue::EnqueueError;
use crate::flows::FlowError;
use crate::messages::MessageError;
use crate::rate::LimitError;
use crate::redact;
use crate::serve::api::keys::KeyError;
use crate::serve::ServeError;
use crate::store::database::StoreError;
use crate::templates::TemplateError;
use crate::webhooks::WebhookError;
use crate::worker::WorkerError;

use super::out::OutputError;

/// Exit code for usage errors (unknown campaign, bad argument, bad URL).
pub const EXIT_USAGE: u8 = 2;
/// pipe(8)'s "try again later" (sysexits.h EX_TEMPFAIL).
pub const EX_TEMPFAIL: u8 = 75;

/// How a failed command ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The environment failed (database down, relay refused): exit 1.
    Runtime,
    /// What the user typed is wrong: exit 2.
    Usage,
    /// Nobody reads stdout any more: exit 0, say nothing.
    Quiet,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Runtime => 1,
            Exit::Usage => EXIT_USAGE,
            Exit::Quiet => 0,
        }
    }
}

/// An error that knows how the process ends when a command fails with it.
pub trait ExitKind {
    fn exit_kind(&self) -> Exit;
}

fn usage_if(usage: bool) -> Exit {
    if usage {
        Exit::Usage
    } else {
        Exit::Runtime
    }
}

/// A usage error raised at the edge (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Everything a command can fail with. Each variant shows its error as it
/// is (transparent), so the cause chain on stderr is the inner error's.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Usage(#[from] UsageError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Compose(#[from] ComposeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Dkim(#[from] DkimError),
    #[error(transparent)]
    Keygen(#[from] KeygenError),
    #[error(transparent)]
    Campaign(#[from] CampaignError),
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error(transparent)]
    Enqueue(#[from] EnqueueError),
    #[error(transparent)]
    Requeue(#[from] RequeueError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    List(#[from] ListError),
    #[error(transparent)]
    Optout(#[from] OptoutError),
    #[error(transparent)]
    Suppress(#[from] SuppressError),
    #[error(transparent)]
    Subscriber(#[from] SubscriberError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    #[error(transparent)]
    Message(#[from] MessageError),
    #[error(transparent)]
    ApiKey(#[from] KeyError),
    #[error(transparent)]
    Flow(#[from] FlowError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl ExitKind for CliError {
    fn exit_kind(&self) -> Exit {
        match self {
            CliError::Usage(e) => e.exit_kind(),
            CliError::Config(e) => e.exit_kind(),
            CliError::Template(e) => e.exit_kind(),
            CliError::Compose(e) => e.exit_kind(),
            CliError::Store(e) => e.exit_kind(),
            CliError::Dkim(e) => e.exit_kind(),
            CliError::Keygen(e) => e.exit_kind(),
            CliError::Campaign(e) => e.exit_kind(),
            CliError::Limit(e) => e.exit_kind(),
            CliError::Enqueue(e) => e.exit_kind(),
            CliError::Requeue(e) => e.exit_kind(),
            CliError::Import(e) => e.exit_kind(),
            CliError::List(e) => e.exit_kind(),
            CliError::Optout(e) => e.exit_kind(),
            CliError::Suppress(e) => e.exit_kind(),
            CliError::Subscriber(e) => e.exit_kind(),
            CliError::Worker(e) => e.exit_kind(),
            CliError::Serve(e) => e.exit_kind(),
            CliError::Webhook(e) => e.exit_kind(),
            CliError::Message(e) => e.exit_kind(),
            CliError::ApiKey(e) => e.exit_kind(),
            CliError::Flow(e) => e.exit_kind(),
            CliError::Output(e) => e.exit_kind(),
            CliError::Json(e) => e.exit_kind(),
        }
    }
}

impl ExitKind for FlowError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for UsageError {
    fn exit_kind(&self) -> Exit {
        Exit::Usage
    }
}

impl ExitKind for ConfigError {
    /// Every configuration error is something the user typed or set.
    fn exit_kind(&self) -> Exit {
        Exit::Usage
    }
}

impl ExitKind for TemplateError {
    fn exit_kind(&self) -> Exit {
        usage_if(matches!(self, TemplateError::Unknown(_)))
    }
}

impl ExitKind for ComposeError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for StoreError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for DkimError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for KeygenError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for CampaignError {
    fn exit_kind(&self) -> Exit {
        match self {
            CampaignError::Bad(_)
            | CampaignError::Content(_)
            | CampaignError::NotDraft { .. }
            | CampaignError::NotEditable { .. }
            | CampaignError::SendAt(_) => Exit::Usage,
            CampaignError::Send(_) => Exit::Runtime,
            CampaignError::Config(e) => e.exit_kind(),
            CampaignError::Template(e) => e.exit_kind(),
            CampaignError::Compose(e) => e.exit_kind(),
            CampaignError::Store(e) => e.exit_kind(),
        }
    }
}

impl ExitKind for LimitError {
    fn exit_kind(&self) -> Exit {
        match self {
            LimitError::Bad(_) => Exit::Usage,
            LimitError::Store(e) => e.exit_kind(),
        }
    }
}

impl ExitKind for EnqueueError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for RequeueError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for ImportError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for KeyError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for WebhookError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for MessageError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for ListError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for SubscriberError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for SuppressError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for OptoutError {
    fn exit_kind(&self) -> Exit {
        usage_if(self.is_usage())
    }
}

impl ExitKind for WorkerError {
    fn exit_kind(&self) -> Exit {
        match self {
            WorkerError::Store(e) => e.exit_kind(),
            WorkerError::Relay(_) | WorkerError::Run(_) => Exit::Runtime,
        }
    }
}

impl ExitKind for ServeError {
    fn exit_kind(&self) -> Exit {
        match self {
            ServeError::Store(e) => e.exit_kind(),
            ServeError::Run(_) => Exit::Runtime,
        }
    }
}

impl ExitKind for OutputError {
    fn exit_kind(&self) -> Exit {
        if self.closed() {
            Exit::Quiet
        } else {
            Exit::Runtime
        }
    }
}

impl ExitKind for serde_json::Error {
    fn exit_kind(&self) -> Exit {
        Exit::Runtime
    }
}

/// End a failed command: its whole cause chain on stderr (redacted), and
/// the exit code its [`ExitKind`] names; nothing at all for a closed stdout.
pub fn fail(err: CliError) -> ExitCode {
    let kind = err.exit_kind();
    if kind != Exit::Quiet {
        // Every URL in the chain is shown redacted already; this is the
        // last line of defence for one that is not.
        let shown = redact::text(&format!("{:#}", anyhow::Error::from(err)));
        super::out::error_line(&format!("mailsplit: error: {shown}"));
    }
    ExitCode::from(kind.code())
}
