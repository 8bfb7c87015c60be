//! `mailsplit templates` and `templates show NAME`.

use crate::cli::args::TemplatesCommand;
use crate::cli::out::outln;
use crate::templates::{self, TEMPLATES};

use super::Result;

/// The built-in template names, one per line; or one's source.
pub fn templates(command: Option<TemplatesCommand>) -> Result {
    let Some(TemplatesCommand::Show { name, html, text }) = command else {
        for name in TEMPLATES {
            outln!("{name}")?;
        }
        return Ok(());
    };
    let (html_source, text_source) = templates::starter(&name)?;
    match (html, text) {
        (true, _) => outln!("{}", html_source.trim_end())?,
        (_, true) => outln!("{}", text_source.trim_end())?,
        _ => {
            outln!("==> {name}.html <==")?;
            outln!("{}", html_source.trim_end())?;
            outln!("")?;
            outln!("==> {name}.txt <==")?;
            outln!("{}", text_source.trim_end())?;
        }
    }
    Ok(())
}
