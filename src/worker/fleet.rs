//! The worker fleet as an operator sees it (`mailsplit workers`, the
//! dashboard, `/metrics`): every worker's heartbeat row, whether it is
//! running, stopping or lost, and which binary is the newest, so a deploy
//! can be watched until every worker runs it.

use serde::Serialize;

use crate::config::LOST_AFTER;
use crate::store::workers::{WorkerRow, WorkerState};

/// Characters of the binary's SHA-256 shown (48 bits: enough to tell
/// builds apart at a glance).
pub const SHORT_HASH: usize = 12;

/// What a worker is doing, as far as its heartbeat tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    Running,
    /// Told to stop (signal or deploy), finishing its jobs.
    Stopping,
    /// No heartbeat for longer than [`LOST_AFTER`]: killed, or cut off from
    /// the database.
    Lost,
}

impl Liveness {
    pub const ALL: [Liveness; 3] = [Liveness::Running, Liveness::Stopping, Liveness::Lost];

    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Running => "running",
            Liveness::Stopping => "stopping",
            Liveness::Lost => "lost",
        }
    }
}

/// One worker, as `workers --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worker {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub version: String,
    /// Short SHA-256 of the running executable.
    pub binary: String,
    pub binary_size: i64,
    /// Modification time of the executable, ms since the epoch.
    pub binary_mtime: i64,
    /// Whether it runs the newest binary of the fleet.
    pub newest: bool,
    pub state: Liveness,
    pub relay: String,
    pub concurrency: i64,
    /// ms since the epoch.
    pub started_at: i64,
    pub seen_at: i64,
    /// Seconds since its last heartbeat.
    pub seen_ago: f64,
    pub sent: i64,
    /// Messages per second, over its last heartbeat interval; 0 when lost.
    pub rate: f64,
    /// The named tube it reserves from.
    pub tube: String,
    /// Jobs of other databases it met in that tube (moved to their own
    /// tubes), and those databases.
    pub foreign_jobs: i64,
    pub foreign_databases: Vec<String>,
}

/// The whole fleet.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Fleet {
    pub workers: Vec<Worker>,
    pub running: usize,
    pub stopping: usize,
    pub lost: usize,
    /// The newest binary among the workers that are not lost (by the
    /// executable's modification time), and how many of those run it.
    pub newest: Option<String>,
    pub on_newest: usize,
}

impl Fleet {
    /// Workers that are not lost.
    pub fn alive(&self) -> usize {
        self.running + self.stopping
    }

    pub fn count(&self, state: Liveness) -> usize {
        match state {
            Liveness::Running => self.running,
            Liveness::Stopping => self.stopping,
            Liveness::Lost => self.lost,
        }
    }

    /// One line: how many run, stop and are lost, and how far a deploy is.
    pub fn summary(&self) -> String {
        let total = self.workers.len();
        if total == 0 {
            return "no workers have reported (a worker writes its heartbeat within seconds of starting)".into();
        }
        let mut line = format!(
            "{total} worker(s): {} running, {} stopping, {} lost",
            self.running, self.stopping, self.lost
        );
        if let Some(newest) = &self.newest {
            line.push_str(&format!(
                "; {} of {} alive on the newest binary {newest}",
                self.on_newest,
                self.alive()
            ));
        }
        line
    }

    /// The human-readable table of `mailsplit workers`.
    pub fn render(&self, now_ms: i64) -> String {
        let mut out = format!(
            "{:<20} {:>8} {:<13} {:<9} {:>9} {:>9} {:>10} {:>9}\n",
            "HOST", "PID", "BINARY", "STATE", "STARTED", "SEEN", "SENT", "RATE/S"
        );
        for w in &self.workers {
            let mark = if w.newest { "" } else { "*" };
            out.push_str(&format!(
                "{:<20} {:>8} {:<13} {:<9} {:>9} {:>9} {:>10} {:>9.1}\n",
                w.host,
                w.pid,
                format!("{}{mark}", w.binary),
                w.state.as_str(),
                ago(now_ms - w.started_at),
                ago(now_ms - w.seen_at),
                w.sent,
                w.rate
            ));
        }
        out.push_str(&self.summary());
        if self.workers.iter().any(|w| !w.newest) {
            out.push_str("\n* not the newest binary");
        }
        for note in self.shared_tubes() {
            out.push('\n');
            out.push_str(&note);
        }
        out
    }

    /// One line per tube in which these workers met jobs of other
    /// databases: `mailsplit status` and `mailsplit workers` print them.
    pub fn shared_tubes(&self) -> Vec<String> {
        let mut tubes: Vec<(&str, i64, Vec<&str>)> = Vec::new();
        for w in self.workers.iter().filter(|w| w.foreign_jobs > 0) {
            let i = match tubes.iter().position(|t| t.0 == w.tube) {
                Some(i) => i,
                None => {
                    tubes.push((&w.tube, 0, Vec::new()));
                    tubes.len() - 1
                }
            };
            tubes[i].1 += w.foreign_jobs;
            for d in &w.foreign_databases {
                if !tubes[i].2.contains(&d.as_str()) {
                    tubes[i].2.push(d);
                }
            }
        }
        tubes
            .into_iter()
            .map(|(tube, jobs, dbs)| {
                format!(
                    "note: tube {tube} is shared: it holds jobs of another database ({}); \
                     these workers moved {jobs} of them to that database's own tube \
                     (mailsplit-<database>). Give each database its own --tube.",
                    dbs.join(", ")
                )
            })
            .collect()
    }
}

/// The fleet as its heartbeat rows show it now, and that moment (ms
/// since the epoch) to render it at.
pub fn load(conn: &mut crate::store::Conn) -> crate::store::Result<(Fleet, i64)> {
    let now = crate::store::now_ms();
    Ok((view(crate::store::workers::list(conn)?, now), now))
}

/// The fleet from its heartbeat rows at time `now_ms`.
pub fn view(rows: Vec<WorkerRow>, now_ms: i64) -> Fleet {
    let lost_ms = LOST_AFTER.as_millis() as i64;
    let liveness = |r: &WorkerRow| match r.state {
        _ if now_ms - r.seen_at > lost_ms => Liveness::Lost,
        WorkerState::Running => Liveness::Running,
        WorkerState::Stopping => Liveness::Stopping,
    };
    // Newest: the live binary modified last (a deploy writes a new file);
    // when nobody is alive, the newest of all.
    let pick = |alive_only: bool| {
        rows.iter()
            .filter(|r| !alive_only || liveness(r) != Liveness::Lost)
            .max_by(|a, b| (a.binary_mtime, &a.binary_hash).cmp(&(b.binary_mtime, &b.binary_hash)))
            .map(|r| r.binary_hash.clone())
    };
    let newest = pick(true).or_else(|| pick(false));
    let mut fleet = Fleet {
        newest: newest.as_deref().map(short),
        ..Fleet::default()
    };
    for r in rows {
        let state = liveness(&r);
        let is_newest = newest.as_deref() == Some(r.binary_hash.as_str());
        match state {
            Liveness::Running => fleet.running += 1,
            Liveness::Stopping => fleet.stopping += 1,
            Liveness::Lost => fleet.lost += 1,
        }
        if is_newest && state != Liveness::Lost {
            fleet.on_newest += 1;
        }
        fleet.workers.push(Worker {
            binary: short(&r.binary_hash),
            seen_ago: ((now_ms - r.seen_at).max(0) as f64 / 100.0).round() / 10.0,
            rate: if state == Liveness::Lost { 0.0 } else { r.rate },
            newest: is_newest,
            state,
            id: r.id,
            host: r.host,
            pid: r.pid,
            version: r.version,
            binary_size: r.binary_size,
            binary_mtime: r.binary_mtime,
            relay: r.relay,
            concurrency: r.concurrency,
            started_at: r.started_at,
            seen_at: r.seen_at,
            sent: r.sent,
            foreign_databases: r
                .foreign_databases
                .split(',')
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect(),
            foreign_jobs: r.foreign_jobs,
            tube: r.tube,
        });
    }
    fleet
}

fn short(hash: &str) -> String {
    hash.chars().take(SHORT_HASH).collect()
}

/// A duration in ms as `42s`, `7m`, `3h`, `2d` (a clock running a little
/// behind shows `0s`).
pub fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: i64, hash: &str, mtime: i64, state: WorkerState, seen_at: i64) -> WorkerRow {
        WorkerRow {
            id: format!("h/{pid}/0"),
            host: "h".into(),
            pid,
            version: "0".into(),
            binary_hash: hash.into(),
            binary_size: 1,
            binary_mtime: mtime,
            relay: "r:25".into(),
            concurrency: 1,
            state,
            started_at: 0,
            seen_at,
            sent: 10,
            rate: 5.0,
            tube: "mailsplit".into(),
            foreign_jobs: 0,
            foreign_databases: String::new(),
        }
    }

    #[test]
    fn lost_workers_do_not_decide_the_newest_binary() {
        let now = 1_000_000;
        let fleet = view(
            vec![
                row(1, "aaaa", 10, WorkerState::Running, now - 1_000),
                row(2, "bbbb", 20, WorkerState::Stopping, now - 1_000),
                // The newest file, but its worker is gone: not "newest".
                row(3, "cccc", 30, WorkerState::Running, now - 60_000),
            ],
            now,
        );
        assert_eq!((fleet.running, fleet.stopping, fleet.lost), (1, 1, 1));
        assert_eq!(fleet.newest.as_deref(), Some("bbbb"));
        assert_eq!(fleet.on_newest, 1);
        assert_eq!(fleet.workers[2].state, Liveness::Lost);
        assert_eq!(fleet.workers[2].rate, 0.0);
        assert!(fleet
            .summary()
            .contains("1 of 2 alive on the newest binary bbbb"));
        let table = fleet.render(now);
        assert!(table.contains("aaaa*"), "{table}");
    }

    #[test]
    fn all_lost_still_names_a_newest_binary() {
        let fleet = view(vec![row(1, "aaaa", 10, WorkerState::Running, 0)], 1_000_000);
        assert_eq!(fleet.newest.as_deref(), Some("aaaa"));
        assert_eq!((fleet.lost, fleet.on_newest), (1, 0));
        assert!(view(vec![], 0).summary().starts_with("no workers"));
    }

    #[test]
    fn ages() {
        assert_eq!(ago(-5), "0s");
        assert_eq!(ago(59_999), "59s");
        assert_eq!(ago(61_000), "1m");
        assert_eq!(ago(7_200_000), "2h");
        assert_eq!(ago(200_000_000), "2d");
    }
}
