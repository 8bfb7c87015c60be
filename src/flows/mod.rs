//! Flows (issue 39): mail that sends itself. A flow is a list's join
//! trigger and steps (marketing-stream message templates, each after its
//! delay from the entry). `flow create|ls|pause|resume|report` are here;
//! the scheduler every worker runs (one at a time, under a database
//! lease) is [`scheduler`]. A step goes out as a message
//! ([`crate::messages::submit`]) under the idempotency key
//! `flow:{flow}:{entry}:{step}`, so the messages' unique index makes each
//! step of each entry exactly once, whatever crashes in between.

pub mod scheduler;
pub mod sql;

use serde::Serialize;

use crate::audience::source::SourceError;
use crate::messages::MessageError;
use crate::store::content::Track;
use crate::store::flows::{self as store, EntryState, Flow, FlowState, NewFlow, Trigger};
use crate::store::message_templates::{self, Stream};
use crate::store::recipients::get_or_create_list;
use crate::store::{Conn, StoreError};

/// Why a flow command was refused.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("unknown flow {0:?}; `mailsplit flow ls` shows them")]
    Unknown(String),
    #[error("flow {0:?} already exists; pick another name")]
    Exists(String),
    #[error(
        "bad step {0:?}: write DELAY:TEMPLATE, e.g. 0:welcome or 3d:tips (delays: s, m, h, d)"
    )]
    BadStep(String),
    #[error("a flow needs at least one --step DELAY:TEMPLATE")]
    NoSteps,
    #[error("step {n} ({delay}) comes before step {before}'s delay: give the steps in the order they go out")]
    OutOfOrder {
        n: usize,
        delay: String,
        before: usize,
    },
    #[error("unknown message template {0:?}; create it with `mailsplit template create {0} --stream marketing …`")]
    UnknownTemplate(String),
    #[error("message template {0:?} is transactional; flow steps are marketing mail (`mailsplit template edit {0} --stream marketing`)")]
    Transactional(String),
    #[error("the --trigger-sql query returns {0}: it must return the columns `email` and `key` (e.g. SELECT email, cart_id AS key, total FROM carts WHERE …)")]
    TriggerColumns(String),
    #[error(
        "--trigger-sql needs --source URL (or MAILSPLIT_SOURCE_URL) and --every DELAY (e.g. 5m)"
    )]
    NeedsSource,
    #[error("bad --every {0:?}: write a delay of at least 1s, e.g. 30s, 5m, 1h")]
    BadEvery(String),
    #[error("a --trigger-sql flow has no list (its rows become recipients); leave out --list and --trigger")]
    SqlWithList,
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("say what starts the flow: --list LIST --trigger join, or --trigger-sql QUERY --source URL --every DELAY")]
    NoTrigger,
    #[error("--trigger join needs --list LIST")]
    NoList,
    #[error("unknown trigger {0:?}: join (or --trigger-sql QUERY)")]
    BadTrigger(String),
    #[error("flow {0:?} is already {1}")]
    AlreadyThere(String, &'static str),
    #[error(transparent)]
    Message(#[from] MessageError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FlowError {
    /// Errors in what the user typed (exit 2).
    pub fn is_usage(&self) -> bool {
        match self {
            FlowError::Message(e) => e.is_usage(),
            FlowError::Store(e) => e.is_usage(),
            FlowError::Source(e) => e.is_usage(),
            _ => true,
        }
    }
}

/// A delay as `flow create` accepts it: a number and `s`, `m`, `h` or
/// `d` (a bare `0` is now); milliseconds.
pub fn parse_delay(raw: &str) -> Option<i64> {
    let raw = raw.trim();
    if raw == "0" {
        return Some(0);
    }
    let unit = raw.chars().last()?;
    let ms = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return None,
    };
    let n: i64 = raw[..raw.len() - 1].parse().ok()?;
    (0..=3650 * 86_400_000 / ms).contains(&n).then_some(n * ms)
}

/// `DELAY:TEMPLATE`.
pub fn parse_step(raw: &str) -> Result<(i64, String), FlowError> {
    let bad = || FlowError::BadStep(raw.to_string());
    let (delay, template) = raw.split_once(':').ok_or_else(bad)?;
    let delay = parse_delay(delay).ok_or_else(bad)?;
    let template = template.trim();
    if template.is_empty() {
        return Err(bad());
    }
    Ok((delay, template.to_string()))
}

/// What `flow create` was asked.
#[derive(Debug, Clone)]
pub struct CreateFlow {
    pub name: String,
    pub list: Option<String>,
    pub trigger: Option<String>,
    pub steps: Vec<String>,
    pub include_existing: bool,
    /// `--trigger-sql` instead of a list.
    pub sql: Option<SqlTrigger>,
}

/// `--trigger-sql QUERY --source URL --every DELAY`.
#[derive(Debug, Clone)]
pub struct SqlTrigger {
    pub query: String,
    pub source: Option<String>,
    pub every: Option<String>,
    pub allow_privileged: bool,
}

/// What `flow create` did.
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    pub id: i64,
    /// The list (a join flow), or none (a SQL trigger).
    pub list: Option<String>,
    pub steps: usize,
    /// Members on the list at creation: entered with
    /// `--include-existing`, left out without.
    pub existing: i64,
    pub entered: u64,
}

/// Check and store a flow.
pub fn create(conn: &mut Conn, c: &CreateFlow) -> Result<Created, FlowError> {
    if let Some(sql) = &c.sql {
        return create_sql(conn, c, sql);
    }
    let trigger = match c.trigger.as_deref() {
        Some("join") => Trigger::Join,
        Some(t) => return Err(FlowError::BadTrigger(t.to_string())),
        None if c.list.is_some() => Trigger::Join,
        None => return Err(FlowError::NoTrigger),
    };
    let list = c.list.as_deref().ok_or(FlowError::NoList)?;
    let steps = steps(conn, &c.steps)?;
    conn.transaction(|conn| {
        let list_id = get_or_create_list(conn, list)?;
        let id = store::create(
            conn,
            &NewFlow {
                name: &c.name,
                trigger,
                list_id: Some(list_id),
                sql_query: None,
                sql_source: None,
                every_ms: None,
                allow_privileged: false,
                steps: &steps,
            },
        )?
        .ok_or_else(|| FlowError::Exists(c.name.clone()))?;
        let existing = store::active_members(conn, list_id)?;
        let entered = if c.include_existing {
            store::enter_existing(conn, id, list_id, steps[0].0)?
        } else {
            0
        };
        Ok(Created {
            id,
            list: Some(list.to_string()),
            steps: steps.len(),
            existing,
            entered,
        })
    })
}

/// Check and store a `--trigger-sql` flow: the source opens, the query
/// is one read-only statement returning `email` and `key`.
fn create_sql(conn: &mut Conn, c: &CreateFlow, sql: &SqlTrigger) -> Result<Created, FlowError> {
    if c.list.is_some() || c.trigger.is_some() || c.include_existing {
        return Err(FlowError::SqlWithList);
    }
    let (Some(url), Some(every)) = (&sql.source, &sql.every) else {
        return Err(FlowError::NeedsSource);
    };
    let every_ms = parse_delay(every)
        .filter(|&ms| ms >= sql::MIN_EVERY_MS)
        .ok_or_else(|| FlowError::BadEvery(every.clone()))?;
    let steps = steps(conn, &c.steps)?;
    sql::check(url, &sql.query, sql.allow_privileged)?;
    let id = store::create(
        conn,
        &NewFlow {
            name: &c.name,
            trigger: Trigger::Sql,
            list_id: None,
            sql_query: Some(&sql.query),
            sql_source: Some(url),
            every_ms: Some(every_ms),
            allow_privileged: sql.allow_privileged,
            steps: &steps,
        },
    )?
    .ok_or_else(|| FlowError::Exists(c.name.clone()))?;
    Ok(Created {
        id,
        list: None,
        steps: steps.len(),
        existing: 0,
        entered: 0,
    })
}

/// The steps parsed, in order, each template a marketing one.
fn steps(conn: &mut Conn, raw: &[String]) -> Result<Vec<(i64, String)>, FlowError> {
    if raw.is_empty() {
        return Err(FlowError::NoSteps);
    }
    let mut out: Vec<(i64, String)> = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        let (delay, template) = parse_step(s)?;
        if let Some((before, _)) = out.last() {
            if delay < *before {
                return Err(FlowError::OutOfOrder {
                    n: i + 1,
                    delay: s.split(':').next().unwrap_or_default().to_string(),
                    before: i,
                });
            }
        }
        let t = message_templates::find(conn, &template)?
            .ok_or_else(|| FlowError::UnknownTemplate(template.clone()))?;
        if t.stream != Stream::Marketing {
            return Err(FlowError::Transactional(template));
        }
        out.push((delay, template));
    }
    Ok(out)
}

fn find(conn: &mut Conn, name: &str) -> Result<Flow, FlowError> {
    store::find(conn, name)?.ok_or_else(|| FlowError::Unknown(name.to_string()))
}

/// Pause (no step goes out; entries still enter) or resume a flow.
pub fn set_paused(conn: &mut Conn, name: &str, paused: bool) -> Result<(), FlowError> {
    let flow = find(conn, name)?;
    let (to, word) = if paused {
        (FlowState::Paused, "paused")
    } else {
        (FlowState::Active, "running")
    };
    if !store::set_state(conn, flow.id, to)? {
        return Err(FlowError::AlreadyThere(name.to_string(), word));
    }
    Ok(())
}

/// One line of `flow ls`.
#[derive(Debug, Clone, Serialize)]
pub struct FlowRow {
    pub name: String,
    pub trigger: String,
    pub list: Option<String>,
    pub state: String,
    pub steps: Vec<StepRow>,
    pub active: i64,
    pub done: i64,
    pub left: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
    pub delay_ms: i64,
    pub template: String,
}

/// Every flow with its steps and entry counts.
pub fn list(conn: &mut Conn) -> Result<Vec<FlowRow>, FlowError> {
    let mut out = Vec::new();
    for f in store::all(conn)? {
        out.push(row(conn, f)?);
    }
    Ok(out)
}

fn row(conn: &mut Conn, f: Flow) -> Result<FlowRow, FlowError> {
    let steps = store::steps(conn, f.id)?
        .into_iter()
        .map(|s| StepRow {
            delay_ms: s.delay_ms,
            template: s.template,
        })
        .collect();
    let list = match f.list_id {
        Some(id) => store::list_name(conn, id)?,
        None => None,
    };
    let (mut active, mut done, mut left) = (0, 0, 0);
    for (state, _, n) in crate::store::flow_report::entry_counts(conn, f.id)? {
        match state {
            EntryState::Active => active += n,
            EntryState::Done => done += n,
            EntryState::Left => left += n,
        }
    }
    Ok(FlowRow {
        name: f.name,
        trigger: f.trigger_kind.as_str().to_string(),
        list,
        state: f.state.as_str().to_string(),
        steps,
        active,
        done,
        left,
    })
}

/// A delay as `flow ls` shows it: the largest unit that divides it.
pub fn show_delay(ms: i64) -> String {
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000)] {
        if ms > 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms == 0 {
        "0".into()
    } else {
        format!("{}s", ms / 1000)
    }
}

/// `flow report`: entries, each step's messages, leavers by reason.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    pub state: String,
    pub entered: i64,
    pub active: i64,
    pub done: i64,
    pub steps: Vec<StepReport>,
    /// Reason → entries that left for it.
    pub left: std::collections::BTreeMap<String, i64>,
}

/// One step's messages by outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepReport {
    pub template: String,
    pub delay_ms: i64,
    /// Messages made for the step (queued or with an outcome).
    pub queued: i64,
    pub sent: i64,
    pub failed: i64,
    pub suppressed: i64,
    /// Entries that left as unsubscribed after this step, before the next.
    pub unsubscribed: i64,
    /// Recipients who opened the step's message (people, not mail
    /// proxies) and who clicked in it: `null` when its template does not
    /// track that (`template edit NAME --track opens,clicks`).
    pub opened: Option<i64>,
    pub clicked: Option<i64>,
}

/// The report of flow `name`.
pub fn report(conn: &mut Conn, name: &str) -> Result<Report, FlowError> {
    let flow = find(conn, name)?;
    let mut steps = Vec::new();
    for s in store::steps(conn, flow.id)? {
        let track = message_templates::find(conn, &s.template)?
            .map(|t| Track::from_column(&t.track))
            .unwrap_or_default();
        steps.push(StepReport {
            template: s.template,
            delay_ms: s.delay_ms,
            opened: track.opens.then_some(0),
            clicked: track.clicks.then_some(0),
            ..StepReport::default()
        });
    }
    for m in crate::store::flow_report::step_messages(conn, flow.id)? {
        let n = m
            .key
            .as_deref()
            .and_then(|k| k.rsplit(':').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(step) = n.and_then(|n| steps.get_mut(n)) {
            count(step, &m);
        }
    }
    unsubscribed_after(conn, flow.id, &mut steps)?;
    let (mut active, mut done) = (0, 0);
    let mut left = std::collections::BTreeMap::new();
    for (state, reason, n) in crate::store::flow_report::entry_counts(conn, flow.id)? {
        match state {
            EntryState::Active => active += n,
            EntryState::Done => done += n,
            EntryState::Left => {
                *left
                    .entry(reason.unwrap_or_else(|| "unknown".into()))
                    .or_insert(0) += n
            }
        }
    }
    Ok(Report {
        entered: active + done + left.values().sum::<i64>(),
        name: flow.name,
        state: flow.state.as_str().to_string(),
        active,
        done,
        steps,
        left,
    })
}

/// Count one step message on its step.
fn count(step: &mut StepReport, m: &crate::store::flow_report::StepMessage) {
    step.queued += 1;
    match m.status.as_str() {
        "sent" => step.sent += 1,
        "failed" | "bounced" => step.failed += 1,
        "suppressed" => step.suppressed += 1,
        _ => {}
    }
    for (n, yes) in [(&mut step.opened, m.opened), (&mut step.clicked, m.clicked)] {
        if let Some(n) = n.as_mut().filter(|_| yes) {
            *n += 1;
        }
    }
}

/// Count on each step the entries that left as unsubscribed while
/// waiting for the next one.
fn unsubscribed_after(
    conn: &mut Conn,
    flow_id: i64,
    steps: &mut [StepReport],
) -> Result<(), FlowError> {
    for (next, reason, n) in crate::store::flow_report::left_by_step(conn, flow_id)? {
        if reason.as_deref() != Some("unsubscribed") || next < 1 {
            continue;
        }
        if let Some(step) = steps.get_mut(next as usize - 1) {
            step.unsubscribed += n;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_and_steps() {
        assert_eq!(parse_delay("0"), Some(0));
        assert_eq!(parse_delay("30s"), Some(30_000));
        assert_eq!(parse_delay("5m"), Some(300_000));
        assert_eq!(parse_delay("3d"), Some(3 * 86_400_000));
        assert_eq!(parse_delay("3"), None);
        assert_eq!(parse_delay("-1h"), None);
        assert_eq!(parse_delay("1w"), None);
        assert_eq!(parse_step("3d:tips").unwrap(), (259_200_000, "tips".into()));
        assert!(parse_step("tips").is_err());
        assert!(parse_step("3d:").is_err());
        assert_eq!(show_delay(259_200_000), "3d");
        assert_eq!(show_delay(90_000), "90s");
        assert_eq!(show_delay(0), "0");
    }
}
