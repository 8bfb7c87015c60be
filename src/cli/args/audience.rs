//! `import`'s and `list`'s arguments.

use std::path::PathBuf;

use clap::{Args, Subcommand};

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

#[derive(Subcommand, Debug)]
pub enum ListCommand {
    /// Make an empty list by hand, with the face subscribers see: its
    /// title, whether `/subscribe` offers it (`--public`) and whether
    /// joining there needs a confirmed mail (`--double-opt-in`). Lists
    /// made by `import` stay private and single opt-in until `list set`.
    Create {
        /// The list's name (what `--list` and `campaign create` use)
        name: String,
        #[command(flatten)]
        face: ListFaceArgs,
    },
    /// Print an HTML form to paste into a web page: it posts to
    /// MAILSPLIT_PUBLIC_URL/subscribe (served by `mailsplit serve`) and
    /// joins the list, with its double opt-in if it has one. The list
    /// must be public.
    Form {
        name: String,
        /// Where `serve`'s public listener is reached (default:
        /// MAILSPLIT_PUBLIC_URL)
        #[arg(long, env = "MAILSPLIT_PUBLIC_URL", value_name = "URL")]
        public_url: Option<String>,
    },
    /// Change a list's title, public or double opt-in
    Set {
        name: String,
        #[command(flatten)]
        face: ListFaceArgs,
    },
    /// Every list: name, members, active members (who may be mailed),
    /// public and double opt-in, title
    Ls,
    /// Take recipients off a list (they stay on file, with their history
    /// and other lists)
    Rm {
        list: String,
        /// Addresses, any spelling of the mailbox
        #[arg(required = true)]
        emails: Vec<String>,
    },
    /// Delete a list (its recipients stay on file); refused while one of
    /// its campaigns is enqueuing, sending or paused
    Delete { list: String },
    /// Take off the list the members its campaigns mailed within the
    /// period who opened and clicked nothing since (only campaigns that
    /// tracked opens or clicks count); they stay on file. Prints the
    /// count first.
    Prune {
        list: String,
        /// The period, e.g. 180d (N followed by d, h, m or s)
        #[arg(long, value_name = "SPAN")]
        inactive: String,
        /// Print only the count and a sample; remove nobody
        #[arg(long)]
        dry_run: bool,
    },
}
