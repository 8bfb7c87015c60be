//! mailsplit: fan a mass-mail campaign out over beanstalkd.
//!
//! Follow a recipient through the modules in this order:
//! [`config`] (what the user asked for) → [`audience`] (a CSV or the
//! shop's database into the [`store`]) → [`campaign`] (content, control,
//! status) → [`enqueue`] (keyset pages of a campaign's list into signed
//! jobs on the [`queue`]) → [`worker`] (reserve, check, claim in the
//! ledger, [`compose`] with [`templates`], send with [`mail`] under the
//! shared [`rate`] limits, record outcomes). [`serve`] is the HTTP side
//! (one-click unsubscribe, tracking, admin), [`bounce`] reads what comes
//! back, [`webhooks`] tell the shop's systems.
//!
//! Imports point one way: [`cli`] → stages ([`audience`], [`campaign`],
//! [`enqueue`], [`rate`], [`worker`], [`serve`], [`bounce`], [`dkim`]) →
//! [`compose`], [`mail`], [`queue`], [`rate::limiter`], [`tokens`],
//! [`shutdown`], [`webhooks`] → [`store`]; [`config`], [`redact`] and
//! [`logging`] sit beside them, importing no stage; [`mailbox`] (which
//! spellings are one mailbox, and the wire spelling), [`rate_group`] and
//! [`dns`] (the resolver `doctor` and the MX rollup share) sit below the
//! store.

pub mod audience;
pub mod bounce;
pub mod campaign;
pub mod cli;
pub mod clock;
pub mod compose;
pub mod config;
pub mod dkim;
pub mod dns;
pub mod doctor;
pub mod enqueue;
pub mod flows;
pub mod logging;
pub mod mail;
pub mod mailbox;
pub mod messages;
pub mod queue;
pub mod rate;
pub mod rate_group;
pub mod redact;
pub mod send_at;
pub mod serve;
pub mod shutdown;
pub mod store;
pub mod templates;
pub mod tokens;
pub mod webhooks;
pub mod worker;
