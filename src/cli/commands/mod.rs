//! One short file per command family. Each command resolves its options
//! ([`super::resolve`]), makes its call into a stage, and prints what came
//! back through [`super::out`].

pub mod apikey;
pub mod bounce;
pub mod campaign;
pub mod control;
pub mod dkim;
pub mod doctor;
pub mod flow;
pub mod import;
pub mod lists;
pub mod messages;
pub mod migrate;
pub mod people;
pub mod queue;
pub mod rate;
pub mod report;
pub mod serve;
pub mod status;
pub mod templates;
pub mod webhook;
pub mod worker;

use crate::store::database::{self, Conn};

use super::args::Global;
use super::exit::CliError;

/// What every command returns.
pub type Result<T = ()> = std::result::Result<T, CliError>;

/// Open, and fail with "run `mailsplit migrate`" when the schema is missing.
fn open_migrated(g: &Global) -> Result<Conn> {
    Ok(database::open_migrated(&g.database_url)?)
}

/// [`open_migrated`] for commands that only read.
fn open_read_only(g: &Global) -> Result<Conn> {
    Ok(database::open_read_only(&g.database_url)?)
}
