//! `mailsplit flow create|ls|pause|resume`.

use crate::cli::args::{FlowCommand, Global};
use crate::cli::out::outln;
use crate::flows::{self, show_delay, CreateFlow, SqlTrigger};

use super::{open_migrated, open_read_only, Result};

/// `flow …`.
pub fn flow(g: &Global, cmd: FlowCommand) -> Result {
    match cmd {
        FlowCommand::Create {
            name,
            list,
            trigger,
            steps,
            include_existing,
            trigger_sql,
            source,
            every,
            allow_privileged_source,
        } => {
            let sql = trigger_sql.map(|query| SqlTrigger {
                query,
                source,
                every: every.clone(),
                allow_privileged: allow_privileged_source,
            });
            let c = CreateFlow {
                name,
                list,
                trigger,
                steps,
                include_existing,
                sql,
            };
            create(g, &c, every)
        }
        FlowCommand::Ls { json } => ls(g, json),
        FlowCommand::Report { name, json } => report(g, &name, json),
        FlowCommand::Pause { name } => {
            flows::set_paused(&mut open_migrated(g)?, &name, true)?;
            outln!("paused flow {name:?}: no step goes out until `mailsplit flow resume {name}`")?;
            Ok(())
        }
        FlowCommand::Resume { name } => {
            flows::set_paused(&mut open_migrated(g)?, &name, false)?;
            outln!("resumed flow {name:?}")?;
            Ok(())
        }
    }
}

/// `flow create`: what was made, and who entered or did not.
fn create(g: &Global, c: &CreateFlow, every: Option<String>) -> Result {
    let name = &c.name;
    let done = flows::create(&mut open_migrated(g)?, c)?;
    let Some(list) = &done.list else {
        outln!(
            "created flow {name:?}: the workers run its query every {}; each new (email, key) enters, {} step(s)",
            every.unwrap_or_default(),
            done.steps
        )?;
        return Ok(());
    };
    outln!(
        "created flow {name:?}: new members of {list:?} enter, {} step(s)",
        done.steps
    )?;
    if c.include_existing {
        outln!("entered {} member(s) already on the list", done.entered)?;
    } else if done.existing > 0 {
        outln!(
            "{} member(s) already on {list:?} do not enter; --include-existing enters them",
            done.existing,
        )?;
    }
    Ok(())
}

/// `flow ls [--json]`.
fn ls(g: &Global, json: bool) -> Result {
    let all = flows::list(&mut open_read_only(g)?)?;
    if all.is_empty() && !json {
        outln!("no flows; add one with `mailsplit flow create`")?;
    }
    for f in all {
        if json {
            outln!("{}", serde_json::to_string(&f)?)?;
            continue;
        }
        let steps: Vec<String> = f
            .steps
            .iter()
            .map(|s| format!("{}:{}", show_delay(s.delay_ms), s.template))
            .collect();
        outln!(
            "{}  {} {}  {}  steps {}  active {}  done {}  left {}",
            f.name,
            f.trigger,
            f.list.as_deref().unwrap_or("-"),
            f.state,
            steps.join(" "),
            f.active,
            f.done,
            f.left
        )?;
    }
    Ok(())
}

/// `flow report NAME [--json]`.
fn report(g: &Global, name: &str, json: bool) -> Result {
    let r = flows::report(&mut open_read_only(g)?, name)?;
    if json {
        outln!("{}", serde_json::to_string(&r)?)?;
        return Ok(());
    }
    outln!(
        "flow {:?} ({}): entered {}, active {}, done {}",
        r.name,
        r.state,
        r.entered,
        r.active,
        r.done
    )?;
    for (i, s) in r.steps.iter().enumerate() {
        let engaged = [("opened", s.opened), ("clicked", s.clicked)]
            .iter()
            .filter_map(|(what, n)| n.map(|n| format!(", {what} {n}")))
            .collect::<String>();
        outln!(
            "  step {} ({} {}): queued {}, sent {}, failed {}, suppressed {}{engaged}",
            i + 1,
            show_delay(s.delay_ms),
            s.template,
            s.queued,
            s.sent,
            s.failed,
            s.suppressed
        )?;
    }
    for (reason, n) in &r.left {
        outln!("  left ({reason}): {n}")?;
    }
    Ok(())
}
