//! `mailsplit list ls|rm|delete`.

use crate::cli::args::{Global, ListCommand};
use crate::cli::out::{error_line, outln};
use crate::lists;

use super::{open_migrated, open_read_only, Result};

pub fn lists(g: &Global, cmd: ListCommand) -> Result {
    match cmd {
        ListCommand::Ls => {
            let mut conn = open_read_only(g)?;
            let all = lists::overview(&mut conn)?;
            outln!("{:<32} {:>10} {:>10}", "LIST", "MEMBERS", "ACTIVE")?;
            for l in all {
                outln!("{:<32} {:>10} {:>10}", l.name, l.members, l.active)?;
            }
        }
        ListCommand::Rm { list, emails } => {
            let mut conn = open_migrated(g)?;
            let done = lists::remove(&mut conn, &list, &emails)?;
            for email in &done.not_members {
                error_line(&format!("mailsplit: note: {email} is not on list {list:?}"));
            }
            outln!(
                "list {list:?}: removed {} of {}",
                done.removed,
                emails.len()
            )?;
        }
        ListCommand::Delete { list } => {
            let mut conn = open_migrated(g)?;
            let done = lists::delete(&mut conn, &list)?;
            if done.kept_for.is_empty() {
                outln!("list {list:?} deleted ({} members removed)", done.members)?;
            } else {
                outln!(
                    "list {list:?} emptied ({} members removed); its name stays while campaigns name it: {}",
                    done.members,
                    done.kept_for.join(", ")
                )?;
            }
        }
    }
    Ok(())
}
