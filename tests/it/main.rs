//! The integration tests, one binary (linked once) with a module per area,
//! as ripgrep's tests/ are. Run one area or one test:
//!
//! ```sh
//! cargo test --test it worker::              # one area
//! cargo test --test it worker::sqlite::      # one area, one backend
//! cargo nextest run --test it -E 'test(/^ratelimit::/)'
//! scripts/test.sh                            # everything, as CI runs it
//! ```
//!
//! `util` holds the helpers: real servers on free ports (beanstalkd,
//! smtp-sink, a scripted SMTP peer, Postfix), a fresh database per test,
//! `Env` for running the binary. `tests/chaos.rs` (the crash/restart
//! suite behind `scripts/chaos.sh`) is its own binary, built in release,
//! and shares `util`.

#[macro_use]
mod util;

mod admin;
mod bounce;
mod cli;
mod connections;
mod dashboard;
mod delay_proxy;
mod dkim;
mod fleet;
mod hardening;
mod headers;
mod messages;
mod pipelining;
mod postfix;
mod ratelimit;
mod requeue;
mod secrets;
mod serve;
mod store_contract;
mod supervisord;
mod worker;
