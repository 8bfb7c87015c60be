//! mailsplit: fan a mass-mail campaign out over beanstalkd.
//!
//! Follow a recipient through the modules in this order:
//! [`config`] (what the user asked for) → [`import`] (CSV into the
//! [`store`]) → [`splitter`] (keyset pages of a campaign's list into jobs on
//! the [`queue`]) → [`worker`] (reserve, pause check, claim in the ledger,
//! render with [`templates`], send with [`mail`], report outcomes) →
//! [`status`] (the O(1) counters).

pub mod cli;
pub mod config;
pub mod import;
pub mod mail;
pub mod queue;
pub mod ratelimit;
pub mod splitter;
pub mod status;
pub mod store;
pub mod templates;
pub mod worker;
