//! mailsplit: fan a mass-mail campaign out over beanstalkd.
//!
//! Follow a recipient through the modules in this order:
//! [`config`] (what the user asked for) → [`import`] (CSV into the
//! [`store`]) → [`splitter`] (keyset pages of a campaign's list into signed
//! jobs on the [`queue`]) → [`worker`] (reserve, check, claim in the
//! ledger, [`compose`] with [`templates`], send with [`mail`] under the
//! shared [`ratelimit`]s, record outcomes) → [`status`] (the O(1)
//! counters). [`serve`] is the HTTP side (one-click unsubscribe, admin),
//! [`control`] pauses, resumes and cancels, [`fleet`] shows the workers'
//! heartbeats.
//!
//! Imports point one way: [`cli`] → stages ([`campaign`], [`limits`],
//! [`database`], [`import`], [`splitter`], [`worker`], [`serve`],
//! [`control`], [`status`], [`fleet`]) → [`compose`], [`mail`],
//! [`queue`], [`ratelimit`], [`tokens`], [`shutdown`], [`webhooks`] (events
//! out, delivered by workers and `serve`) → [`store`]; [`config`]
//! and [`redact`] (and [`logging`]) sit beside them, importing no stage; [`mailbox`] (which
//! spellings are one mailbox, and the wire spelling) and [`rate_group`] sit below the store.

pub mod bounce;
pub mod campaign;
pub mod cli;
pub mod compose;
pub mod config;
pub mod control;
pub mod database;
pub mod dkim;
pub mod fleet;
pub mod import;
pub mod limits;
pub mod lists;
pub mod logging;
pub mod mail;
pub mod mailbox;
pub mod messages;
pub mod optouts;
pub mod queue;
pub mod rate_group;
pub mod ratelimit;
pub mod redact;
pub mod report;
pub mod requeue;
pub mod send_at;
pub mod serve;
pub mod shutdown;
pub mod source;
pub mod splitter;
pub mod status;
pub mod store;
pub mod templates;
pub mod tokens;
pub mod webhooks;
pub mod worker;
