//! `mailsplit rate warmup`: a rate group that starts slow and grows day by
//! day (a new domain or IP address builds its reputation so), as an
//! operator sets, shows and ends it, and what it means for a campaign's
//! ETA. The budget itself is counted in the database (`store::warmups`),
//! where every worker's lease takes from it.

use crate::rate::limiter::{self, show_rate};
use crate::rate::LimitError;
use crate::rate_group::Group;
use crate::store::warmups::{self, Schedule, Warmup};
use crate::store::{rates, Conn, StoreError};

/// The fastest a schedule may grow per day.
pub const MAX_FACTOR: f64 = 10.0;

/// A `rate warmup GROUP --start R --factor F --every D --until R` as typed.
#[derive(Debug, Clone)]
pub struct WarmupRequest<'a> {
    pub group: &'a str,
    pub start: &'a str,
    pub factor: f64,
    pub every: &'a str,
    pub until: &'a str,
}

/// A checked request: the group's canonical name and the schedule.
#[derive(Debug, Clone)]
pub struct Checked {
    pub group: String,
    pub parsed: Group,
    pub schedule: Schedule,
}

/// Check a request without the database: the group, both rates within
/// what `rate set` accepts, a factor from 1 to [`MAX_FACTOR`], a day of
/// at least a second, and `--until` no slower than `--start`.
pub fn check(req: &WarmupRequest<'_>) -> Result<Checked, LimitError> {
    let bad = |e: limiter::SettingError| LimitError::Bad(e.to_string());
    let start = limiter::setting(req.group, req.start, None).map_err(bad)?;
    let until = limiter::setting(req.group, req.until, None).map_err(bad)?;
    if !(1.0..=MAX_FACTOR).contains(&req.factor) {
        return Err(LimitError::Bad(format!(
            "bad --factor {}: each day's rate is the day before's times the factor, from 1 (flat) to {MAX_FACTOR}, e.g. --factor 1.5",
            req.factor
        )));
    }
    let every_ms = crate::clock::parse_span(req.every)
        .filter(|&ms| ms >= 1_000)
        .ok_or_else(|| {
            LimitError::Bad(format!(
                "bad --every {:?}: the length of a warm-up day, N followed by s, m, h or d, at least 1s, e.g. --every 1d",
                req.every
            ))
        })?;
    if until.per_second < start.per_second {
        return Err(LimitError::Bad(format!(
            "--until {} is slower than --start {}: the schedule grows from --start up to --until",
            req.until, req.start
        )));
    }
    Ok(Checked {
        group: start.group.to_string(),
        parsed: start.group,
        schedule: Schedule {
            start_rate: start.per_second,
            factor: req.factor,
            every_ms,
            until_rate: until.per_second,
        },
    })
}

/// Store a checked schedule, day 0 beginning now. A group that does not
/// exist yet is created at the `--until` rate (the pace within a day);
/// an existing group keeps its rate and burst.
pub fn set(conn: &mut Conn, req: &Checked) -> Result<(), LimitError> {
    let group = &req.group;
    if let Group::Campaign(name) = &req.parsed {
        if !rates::campaign_exists(conn, name)? {
            return Err(LimitError::Bad(format!(
                "bad rate group {group:?}: there is no campaign {name:?} (`mailsplit status` lists them)"
            )));
        }
    }
    let now = crate::store::now_ms();
    if !rates::list(conn)?.iter().any(|g| &g.name == group) {
        let rate = req.schedule.until_rate;
        let burst = (rate / 10.0).ceil().max(1.0) as i64;
        rates::set(conn, group, rate, burst)?;
    }
    warmups::set(conn, group, &req.schedule, now)?;
    warmups::touch_group(conn, group, now)?;
    Ok(())
}

/// End a group's warm-up (the group keeps its rate).
pub fn off(conn: &mut Conn, group: &str) -> Result<(), LimitError> {
    let name = rates::check_name(group).map_err(|e| LimitError::Bad(e.to_string()))?;
    if !warmups::delete(conn, &name)? {
        return Err(LimitError::Bad(format!(
            "rate group {name:?} has no warm-up; `mailsplit rate list` shows them"
        )));
    }
    warmups::touch_group(conn, &name, crate::store::now_ms())?;
    Ok(())
}

/// `200/d ×1.5 every 1d up to 100000/d`.
pub fn describe(s: &Schedule) -> String {
    format!(
        "{} ×{} every {} up to {}",
        show_rate(s.start_rate),
        s.factor,
        crate::clock::show_span(s.every_ms),
        show_rate(s.until_rate)
    )
}

fn schedule_of(w: &Warmup) -> Schedule {
    Schedule {
        start_rate: w.start_rate,
        factor: w.factor,
        every_ms: w.every_ms,
        until_rate: w.until_rate,
    }
}

/// The line `rate list` shows under a warm group: `warm-up day 3 (of 16
/// to the full rate): 675 allowed today, 120 used, next day at T; 200/d
/// ×1.5 every 1d up to 100000/d`.
pub fn line(w: &Warmup, now_ms: i64) -> String {
    let day = w.day_at(now_ms);
    let stage = if day >= w.last_day() {
        "at the full rate".to_string()
    } else {
        format!("of {} to the full rate", w.last_day())
    };
    format!(
        "  warm-up day {day} ({stage}): {} allowed today, {} used, next day at {}; {}",
        w.allowance(day),
        w.used_at(now_ms),
        crate::clock::rfc3339(w.day_start(day + 1), crate::clock::Precision::Seconds),
        describe(&schedule_of(w))
    )
}

/// Every group's warm-up line, by group name.
pub fn lines(conn: &mut Conn) -> Result<Vec<(String, String)>, StoreError> {
    let now = crate::store::now_ms();
    Ok(warmups::list(conn)?
        .iter()
        .map(|w| (w.name.clone(), line(w, now)))
        .collect())
}

/// When a warm-up holds campaign `name` beyond today: the longest wait
/// (ms from now) for its `pending` recipients among the warm groups that
/// all of its mail counts against (a relay's, the campaign's own, and
/// `domain:*`), with a note naming the group and the day. A warm-up of
/// one domain holds only that domain's share, which the counters do not
/// know: it is left out.
pub fn campaign_eta(
    warm: &[Warmup],
    name: &str,
    pending: i64,
    now_ms: i64,
) -> Option<(i64, String)> {
    let own = Group::Campaign(name.to_string()).to_string();
    let any = Group::AnyDomain.to_string();
    warm.iter()
        .filter(|w| w.name == own || w.name == any || Group::is_relay_name(&w.name))
        .filter_map(|w| {
            let (after, day) = w.finish_after(pending, now_ms)?;
            let today = w.day_at(now_ms);
            let note = format!(
                "warm-up of {}: {} days, until day {day}; {} allowed today",
                w.name,
                day - today + 1,
                w.allowance(today)
            );
            Some((after, note))
        })
        .max_by_key(|(after, _)| *after)
}
