//! `mailsplit flow`'s subcommands, as clap sees them.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum FlowCommand {
    /// Create a flow: mail that goes out by itself when a member joins a list
    ///
    /// Every new member of the list (import, API) enters the flow and gets
    /// each step, in order, exactly once, after the step's delay from the
    /// moment they joined. Steps are marketing-stream message templates
    /// (`mailsplit template create NAME --stream marketing …`). Members on
    /// the list before the flow existed do not enter unless
    /// --include-existing. A member who unsubscribes, bounces, complains or
    /// is removed from the list gets no further step. The workers send the
    /// steps; no other process is needed.
    ///
    /// Example: mailsplit flow create welcome --list news --trigger join
    /// --step 0:welcome --step 3d:tips
    Create {
        /// The flow's name
        name: String,
        /// The list whose new members enter
        #[arg(long)]
        list: Option<String>,
        /// What starts the flow: join (a member joins --list)
        #[arg(long)]
        trigger: Option<String>,
        /// DELAY:TEMPLATE, repeatable, in order; delays from the entry: 0, 30s, 15m, 2h, 3d
        #[arg(long = "step", required = true)]
        steps: Vec<String>,
        /// Enter the members already on the list too
        #[arg(long)]
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
