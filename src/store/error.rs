//! What can go wrong in the store, told apart for the caller: what the
//! user typed (exit 2), what is worth retrying, and the rest.

use std::time::Duration;

/// Errors a caller of the store can tell apart.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Holds the URL already redacted.
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://USER@HOST/DB")]
    BadUrl(String),
    /// `url` is already redacted, and `reason` (the driver's message, which
    /// may quote the password: libpq does on a bad percent-encoding) too.
    #[error("cannot open database {url}: {reason}")]
    Connect { url: String, reason: String },
    /// Every command but `migrate` opens an existing SQLite file, never
    /// creates one (an empty database would hide a typo in the path).
    #[error("database file {0} does not exist: run `mailsplit migrate` to create it, or check --database-url / DATABASE_URL")]
    NoDatabaseFile(String),
    #[error("cannot create database file {path}")]
    CreateFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error("database schema is {0}: run `mailsplit migrate` first")]
    NotMigrated(&'static str),
    /// The database holds migrations this binary does not know: a newer
    /// mailsplit migrated it, and this one would misread its schema.
    #[error("the database has migrations this mailsplit does not know ({}): this binary is older than the database; run the newer mailsplit that migrated it", .0.join(", "))]
    NewerSchema(Vec<String>),
    #[error("unknown campaign {0:?}; `mailsplit campaign list` shows the campaigns")]
    UnknownCampaign(String),
    #[error("unknown list {name:?}; lists: {choices}")]
    UnknownList { name: String, choices: String },
    #[error("campaign {0:?} already exists")]
    CampaignExists(String),
    #[error("cannot {action} campaign {campaign:?}: it is {state}")]
    IllegalTransition {
        campaign: String,
        action: &'static str,
        state: String,
    },
    #[error("{domain} already has a DKIM key ({algorithm}, selector {selector}); `mailsplit dkim delete {domain} --selector {selector}` removes it")]
    DkimKeyExists {
        domain: String,
        selector: String,
        algorithm: String,
    },
    #[error(transparent)]
    BadRateGroup(#[from] crate::rate_group::GroupError),
    /// This `enqueue` run's lease on the campaign ran out (the run stalled)
    /// and another run holds it now: this one must stop.
    #[error("another `enqueue` run took campaign {0:?} over after this run's lease ran out (was it suspended?); that run finishes the campaign, this one stops")]
    LeaseLost(String),
    /// The SQLite file a long-running process opened is no longer the file
    /// at its path.
    #[error("the database file {path} was {what} while this process had it open: stopping rather than record outcomes in a file nobody reads; put the file back or point DATABASE_URL at the right one, then start again")]
    FileReplaced { path: String, what: &'static str },
    #[error("stored value {value:?} is not a valid {what}")]
    BadValue { what: &'static str, value: String },
    #[error("database task failed: {0}")]
    Task(String),
    /// A call got no answer within the handle's limit (see [`db`]).
    #[error("the database did not answer within {0:?}: its connection is given up and the next call opens a new one; check the network between this host and the database")]
    Stalled(Duration),
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
}

impl StoreError {
    /// Errors caused by what the user typed (exit code 2) rather than by the
    /// environment (exit code 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            StoreError::BadUrl(_)
                | StoreError::UnknownCampaign(_)
                | StoreError::UnknownList { .. }
                | StoreError::CampaignExists(_)
                | StoreError::IllegalTransition { .. }
                | StoreError::DkimKeyExists { .. }
                | StoreError::BadRateGroup(_)
        )
    }

    /// Lost connection, lock timeout or similar: worth retrying later.
    pub fn is_transient(&self) -> bool {
        use diesel::result::Error as E;
        match self {
            StoreError::Connect { .. } | StoreError::Stalled(_) => true,
            StoreError::Query(E::DatabaseError(kind, info)) => {
                use diesel::result::DatabaseErrorKind as K;
                matches!(
                    kind,
                    K::ClosedConnection | K::SerializationFailure | K::UnableToSendCommand
                ) || info.message().contains("locked")
                    || info.message().contains("busy")
                    || info.message().contains("connection")
            }
            _ => false,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
