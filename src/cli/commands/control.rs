//! `mailsplit pause|resume|cancel CAMPAIGN`.

use crate::campaign::control::{self, Control};
use crate::cli::args::Global;
use crate::cli::out::{error_line, outln};
use crate::config;

use super::{open_migrated, Result};

/// Flip a campaign's state; after a resume, say how many delayed jobs came
/// back at once.
pub fn control(g: &Global, name: &str, action: Control) -> Result {
    let servers = config::parse_beanstalkd(&g.beanstalkd)?;
    let mut conn = open_migrated(g)?;
    let done = control::control(&mut conn, &servers, &g.tube, name, action)?;
    let what = match action {
        Control::Pause => "paused; workers stop sending it within a second",
        Control::Resume => "resumed",
        Control::Cancel => "cancelled; workers delete its remaining jobs",
    };
    outln!("campaign {:?} {what}", done.campaign.name)?;
    for (addr, kicked) in done.kicked {
        match kicked {
            Ok(0) => {}
            Ok(n) => outln!("made {n} delayed jobs on {addr} ready again")?,
            Err(e) => error_line(&format!(
                "mailsplit: note: {:#}; the campaign's jobs come back within their release delay (at most 2 min)",
                anyhow::Error::from(e)
            )),
        }
    }
    Ok(())
}
