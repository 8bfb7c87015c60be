//! `mailsplit suppress` and `mailsplit subscriber`'s subcommands, as clap
//! sees them: who is never mailed, and what is held about one person.

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum SuppressCommand {
    /// Never mail these addresses or @domains again (any campaign, flow or message)
    ///
    /// Applied by the workers when they claim a recipient, so it also stops
    /// campaigns already enqueued. Addresses match whatever their case; a
    /// @domain matches recipients at exactly that domain, not its
    /// subdomains (@example.com does not cover a@mail.example.com: add
    /// @mail.example.com too). Suppressed recipients are counted as skipped,
    /// with the reason, in `mailsplit report`.
    ///
    /// Example: mailsplit suppress add ada@example.com @competitor.example --reason 'asked by phone'
    Add {
        /// Addresses (ada@example.com) or whole domains (@example.com)
        #[arg(required = true, value_name = "ADDR|@DOMAIN")]
        entries: Vec<String>,
        /// Why, shown by `suppress ls` and as the skip reason in `report`
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Add a file of addresses or @domains (e.g. your old provider's suppression export)
    ///
    /// The file holds one address or @domain per line (blank lines and
    /// lines starting with # are skipped), or is a CSV whose first line is
    /// a header with an `email` column (the other columns are ignored). The
    /// file is streamed; bad lines are named by line number and skipped,
    /// the rest is added.
    Import {
        /// The file to read
        file: PathBuf,
        /// Why, stored with every entry of the file
        #[arg(long, default_value = "imported")]
        reason: String,
    },
    /// Every entry with its reason and when it was added
    Ls {
        /// One JSON object per line: entry, reason, created_at
        #[arg(long)]
        json: bool,
    },
    /// Take addresses or @domains off the list (they may be mailed again)
    Rm {
        #[arg(required = true, value_name = "ADDR|@DOMAIN")]
        entries: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SubscriberCommand {
    /// One person: address, name, status, lists, attributes, and how many rows mention them
    Show {
        /// The address, any spelling (case does not matter)
        email: String,
        /// The recipient as JSON (what `export` holds under `recipient`, plus `lists`)
        #[arg(long)]
        json: bool,
    },
    /// Every row held about one person, as one JSON object (GDPR art. 15)
    ///
    /// recipient, lists, deliveries (per campaign), engagement, bounces,
    /// webhook events not yet delivered, transactional messages, and the
    /// suppression entry that covers the address, if any.
    Export {
        /// The address, any spelling (case does not matter)
        email: String,
    },
    /// Erase one person for good (GDPR art. 17), and never add the address again
    ///
    /// Erased: name, attributes, list memberships, opens and clicks,
    /// sign-ups, webhook events not yet delivered, the suppression entry,
    /// and the address (and name) in every ledger: campaign deliveries,
    /// bounces, transactional messages, flow entries, relay replies. The
    /// ledger rows themselves stay under a placeholder address
    /// (forgotten-ID@DOMAIN), so campaign counts and `report` stay exact.
    /// What stays is a keyed hash of the address: no import (CSV, SQL,
    /// --sync), API call or flow adds it again, and `send` refuses it;
    /// only the person confirming a double-opt-in sign-up brings it back.
    /// Also DELETE /api/v1/subscribers/{email}. Cannot be undone; run
    /// `subscriber export` first if the person asked for a copy. What each
    /// database keeps afterwards: docs/operations.md, "Forgetting a
    /// person".
    ///
    /// Example: mailsplit subscriber forget ada@example.com --yes
    Forget {
        /// The address, any spelling (case does not matter)
        email: String,
        /// Do it without asking (needed when stdin is not a terminal)
        #[arg(long)]
        yes: bool,
    },
}
