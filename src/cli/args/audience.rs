//! `import`'s arguments.

use std::path::PathBuf;

use clap::Args;

use crate::redact;

/// `import`'s arguments; `Debug` shows the source URL through [`redact`].
#[derive(Args, Clone)]
pub struct ImportArgs {
    /// CSV file to read (or --from-sql with --source)
    #[arg(required_unless_present = "from_sql", conflicts_with = "from_sql")]
    pub file: Option<PathBuf>,
    /// List to add the recipients to (created if new)
    #[arg(long)]
    pub list: String,
    /// Read the recipients from this SELECT on --source instead of a
    /// file: column `email` required, `name` and `status` optional, every
    /// other column an attribute with its type kept (NULL leaves it out)
    #[arg(long, value_name = "QUERY", requires = "source")]
    pub from_sql: Option<String>,
    /// The database --from-sql reads, read-only: postgres://USER@HOST/DB,
    /// mysql://USER:PASSWORD@HOST/DB or sqlite://PATH. A password given
    /// here shows in `ps` to every user of this machine: set
    /// MAILSPLIT_SOURCE_URL instead
    #[arg(
        long,
        env = "MAILSPLIT_SOURCE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub source: Option<String>,
    /// Read --source as a user who can do more than read (a superuser,
    /// server file access, the right to write the tables); refused
    /// without this (README: "A read-only user for --source")
    #[arg(long, requires = "from_sql")]
    pub allow_privileged_source: bool,
    /// Afterwards the list's members are exactly the rows imported:
    /// members not in the source leave the list (their recipient rows,
    /// history and other lists stay)
    #[arg(long)]
    pub sync: bool,
    /// With --sync: a source that names nobody empties the list (without
    /// it, such an import is refused, exit 2)
    #[arg(long, requires = "sync")]
    pub allow_empty: bool,
    /// Let rows saying active (or saying nothing) make active again
    /// recipients who unsubscribed, bounced or complained; without it
    /// they stay as they are and are counted as "kept unsubscribed"
    #[arg(long)]
    pub resubscribe: bool,
}

impl std::fmt::Debug for ImportArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportArgs")
            .field("file", &self.file)
            .field("list", &self.list)
            .field("from_sql", &self.from_sql)
            .field("source", &self.source.as_deref().map(redact::Url))
            .field("allow_privileged_source", &self.allow_privileged_source)
            .field("sync", &self.sync)
            .field("allow_empty", &self.allow_empty)
            .field("resubscribe", &self.resubscribe)
            .finish()
    }
}

/// A list's face, for `list create` and `list set`.
#[derive(clap::Args, Debug, Default)]
pub struct ListFaceArgs {
    /// What the sign-up form and preference centre call the list
    /// (default: its name)
    #[arg(long, value_name = "T")]
    pub title: Option<String>,
    /// Offer the list on the public `/subscribe` form and the preference
    /// centre
    #[arg(long, conflicts_with = "private")]
    pub public: bool,
    /// Take the list off `/subscribe` (its members stay)
    #[arg(long)]
    pub private: bool,
    /// Sign-ups through `/subscribe` join only after clicking the
    /// confirmation mail's link and its button
    #[arg(long, conflicts_with = "single_opt_in")]
    pub double_opt_in: bool,
    /// Sign-ups through `/subscribe` join at once
    #[arg(long)]
    pub single_opt_in: bool,
}
