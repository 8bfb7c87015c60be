//! `mailsplit flow`'s subcommands, as clap sees them.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum FlowCommand {
    /// Create a flow: mail that goes out by itself when a member joins a list, or when a query on your database returns a row
    ///
    /// Join trigger: every new member of the list (import, API) enters the flow and gets
    /// each step, in order, exactly once, after the step's delay from the
    /// moment they joined. Steps are marketing-stream message templates
    /// (`mailsplit template create NAME --stream marketing …`). Members on
    /// the list before the flow existed do not enter unless
    /// --include-existing. A member who unsubscribes, bounces, complains or
    /// is removed from the list gets no further step. The workers send the
    /// steps; no other process is needed.
    ///
    /// SQL trigger (--trigger-sql QUERY --source URL --every DELAY, no
    /// list): the workers run the query every DELAY; each row (columns
    /// `email` and `key`; the others are `row.COL` in the step templates)
    /// enters once per (email, key), its address becoming a recipient if
    /// it is not one (unsubscribed, bounced or suppressed addresses get
    /// nothing). When a step is due and the query no longer returns that
    /// (email, key), the entry leaves instead (the cart was bought). The
    /// query runs read-only, as `import --from-sql` does.
    ///
    /// Example: mailsplit flow create welcome --list news --trigger join
    /// --step 0:welcome --step 3d:tips
    ///
    /// Example: mailsplit flow create cart --trigger-sql "SELECT email,
    /// cart_id AS key, total FROM carts WHERE state = 'abandoned'" --source
    /// postgres://reader@db/shop --every 5m --step 1h:cart-reminder
    Create {
        /// The flow's name
        name: String,
        /// The list whose new members enter
        #[arg(long, conflicts_with = "trigger_sql")]
        list: Option<String>,
        /// What starts the flow: join (a member joins --list)
        #[arg(long, conflicts_with = "trigger_sql")]
        trigger: Option<String>,
        /// Start the flow from this SELECT's rows instead: columns `email`
        /// and `key` required, the others `row.COL` in the templates
        #[arg(long, value_name = "QUERY", requires_all = ["source", "every"])]
        trigger_sql: Option<String>,
        /// The database --trigger-sql reads, read-only:
        /// postgres://USER@HOST/DB, mysql://USER:PASSWORD@HOST/DB or
        /// sqlite://PATH. Stored with the flow (the workers read it); a
        /// password here also shows in `ps`: set MAILSPLIT_SOURCE_URL
        /// instead
        #[arg(
            long,
            env = "MAILSPLIT_SOURCE_URL",
            hide_env_values = true,
            value_name = "URL"
        )]
        source: Option<String>,
        /// How often the workers run --trigger-sql: 30s, 5m, 1h (and at
        /// once when a step is due, so no step goes out on stale rows)
        #[arg(long, value_name = "DELAY")]
        every: Option<String>,
        /// Read --source as a user who can do more than read (refused
        /// without this, as for `import --from-sql`)
        #[arg(long, requires = "trigger_sql")]
        allow_privileged_source: bool,
        /// DELAY:TEMPLATE, repeatable, in order; delays from the entry: 0, 30s, 15m, 2h, 3d
        #[arg(long = "step", required = true)]
        steps: Vec<String>,
        /// Enter the members already on the list too
        #[arg(long, conflicts_with = "trigger_sql")]
        include_existing: bool,
    },
    /// Every flow: trigger, state, steps, entries active, done and left
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Entered, active, done; per step: messages queued, sent, failed, suppressed; left by reason
    Report {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop sending a flow's steps (members still enter; due steps wait)
    Pause { name: String },
    /// Send a paused flow's steps again, the due ones first
    Resume { name: String },
}
