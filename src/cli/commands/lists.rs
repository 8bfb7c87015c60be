//! `mailsplit list create|set|ls|rm|delete|prune` and `mailsplit optouts`.

use crate::audience::lists::{self, Face};
use crate::audience::optouts::{self, OptOut};
use crate::cli::args::{Global, ListCommand, ListFaceArgs};
use crate::cli::exit::CliError;
use crate::cli::out::{self, error_line, outln};

use super::{open_migrated, open_read_only, Result};

pub fn lists(g: &Global, cmd: ListCommand) -> Result {
    match cmd {
        ListCommand::Create { name, face } => {
            let mut conn = open_migrated(g)?;
            lists::create(&mut conn, &name, &face_of(face))?;
            outln!("list {name:?} created")?;
        }
        ListCommand::Set { name, face } => {
            let mut conn = open_migrated(g)?;
            lists::set(&mut conn, &name, &face_of(face))?;
            outln!("list {name:?} changed")?;
        }
        ListCommand::Form { name, public_url } => {
            let base = public_url
                .filter(|u| !u.trim().is_empty())
                .ok_or(lists::ListError::NoPublicUrl)?;
            let base = crate::config::parse_public_url(&base)?;
            let mut conn = open_read_only(g)?;
            let list = lists::for_form(&mut conn, &name)?;
            let form = crate::serve::subscribe::form_html(
                &format!("{base}/subscribe"),
                &[list],
                &Default::default(),
                &[],
            );
            outln!("{form}")?;
        }
        ListCommand::Ls => ls(g)?,
        ListCommand::Rm { list, emails } => rm(g, &list, &emails)?,
        ListCommand::Prune {
            list,
            inactive,
            dry_run,
        } => prune(g, &list, &inactive, dry_run)?,
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

/// `list rm`: who was removed, and who was not a member.
fn rm(g: &Global, list: &str, emails: &[String]) -> Result {
    let mut conn = open_migrated(g)?;
    let done = lists::remove(&mut conn, list, emails)?;
    for email in &done.not_members {
        error_line(&format!("mailsplit: note: {email} is not on list {list:?}"));
    }
    outln!(
        "list {list:?}: removed {} of {}",
        done.removed,
        emails.len()
    )?;
    Ok(())
}

/// `list ls`: one line per list.
fn ls(g: &Global) -> Result {
    let mut conn = open_read_only(g)?;
    let all = lists::overview(&mut conn)?;
    outln!(
        "{:<32} {:>10} {:>10} {:<8} {:<6} TITLE",
        "LIST",
        "MEMBERS",
        "ACTIVE",
        "SHOWN",
        "OPT-IN"
    )?;
    for l in all {
        outln!(
            "{:<32} {:>10} {:>10} {:<8} {:<6} {}",
            l.name,
            l.members,
            l.active,
            if l.is_public { "public" } else { "private" },
            if l.double_opt_in { "double" } else { "single" },
            l.title.as_deref().unwrap_or("-")
        )?;
    }
    Ok(())
}

/// `list prune`: the count and a sample first, then what was removed.
fn prune(g: &Global, list: &str, inactive: &str, dry_run: bool) -> Result {
    let mut conn = open_migrated(g)?;
    let mut shown = Ok(());
    let done = lists::prune(&mut conn, list, inactive, dry_run, |found| {
        shown = show_inactive(list, inactive, found);
    })?;
    shown?;
    if !dry_run {
        outln!(
            "list {list:?}: removed {} inactive members (they stay on file)",
            done.removed
        )?;
    }
    Ok(())
}

fn show_inactive(list: &str, inactive: &str, found: &lists::Pruned) -> Result {
    outln!(
        "list {list:?}: {} members mailed in the last {inactive} opened and clicked nothing",
        found.inactive
    )?;
    for email in &found.sample {
        outln!("  {email}")?;
    }
    if found.inactive > found.sample.len() as u64 {
        outln!("  …")?;
    }
    Ok(())
}

/// The flags as a change: what was not given stays.
fn face_of(a: ListFaceArgs) -> Face {
    Face {
        title: a.title,
        is_public: match (a.public, a.private) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        double_opt_in: match (a.double_opt_in, a.single_opt_in) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
    }
}

/// Print every opt-out as CSV (header row first) or JSON lines, a page at
/// a time.
pub fn optouts(g: &Global, since: Option<&str>, json: bool) -> Result {
    let since = since.map(optouts::parse_since).transpose()?;
    let mut conn = open_read_only(g)?;
    if !json {
        outln!("email,what,when,campaign")?;
    }
    optouts::export(&mut conn, since, |page: &[OptOut]| {
        let mut text = Vec::new();
        for o in page {
            if json {
                serde_json::to_writer(&mut text, o)?;
                text.push(b'\n');
            } else {
                text.extend_from_slice(csv_line(o).as_bytes());
            }
        }
        out::bytes(&text)?;
        Ok::<_, CliError>(())
    })
}

/// One CSV record: fields quoted when they need it.
fn csv_line(o: &OptOut) -> String {
    let field = |v: &str| {
        if v.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", v.replace('"', "\"\""))
        } else {
            v.to_string()
        }
    };
    format!(
        "{},{},{},{}\n",
        field(&o.email),
        o.what,
        o.when.as_deref().unwrap_or(""),
        field(o.campaign.as_deref().unwrap_or(""))
    )
}
