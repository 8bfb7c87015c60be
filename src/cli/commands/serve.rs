//! `mailsplit serve`.

use crate::cli::args::{Global, ServeArgs};
use crate::cli::resolve::serve_settings;
use crate::serve;

use super::Result;

/// Serve the public and admin routes until SIGTERM or SIGINT.
pub fn serve(g: &Global, args: &ServeArgs) -> Result {
    Ok(serve::run(serve_settings(g, args)?)?)
}
