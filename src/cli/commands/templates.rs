//! `mailsplit templates`.

use crate::cli::out::outln;
use crate::templates::TEMPLATES;

use super::Result;

/// The compiled-in template names, one per line.
pub fn templates() -> Result {
    for name in TEMPLATES {
        outln!("{name}")?;
    }
    Ok(())
}
