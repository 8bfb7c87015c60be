//! `mailsplit worker`.

use crate::cli::args::{Global, WorkerArgs};
use crate::cli::resolve::worker_settings;
use crate::worker;

use super::Result;

/// Run a worker until it is told to stop.
pub fn worker(g: &Global, args: &WorkerArgs) -> Result {
    Ok(worker::run(worker_settings(g, args)?)?)
}
