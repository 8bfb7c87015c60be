//! beanstalkd: the job format and a thin, typed wrapper over the `beanstalkc`
//! client. One [`Server`] is one TCP connection; a job reserved on it can
//! only be deleted, released, buried or touched through that same
//! connection, so the worker keeps one thread per server (see
//! `worker::reserve`). [`timed`] is the small client with deadlines that
//! `serve` and `resume` use.

pub mod message;
pub mod timed;

use std::net::SocketAddr;
use std::time::Duration;

use beanstalkc::{Beanstalkc, BeanstalkcError};
use serde::{Deserialize, Serialize};

use crate::config::MAX_JOB_RECIPIENTS;
use crate::tokens::Identity;

/// Time-to-run of every job: a job whose worker neither finishes nor touches
/// it within this time goes back to the ready queue, and the ledger claims
/// made for it become claimable again after the same time.
pub const JOB_TTR: Duration = Duration::from_secs(30);

/// The lease in force: [`JOB_TTR`], unless the hidden `MAILSPLIT_LEASE_MS`
/// (at least 3000) shortens it. Why: the tests that cut a worker off for
/// longer than a lease need not wait half a minute to prove it; every
/// process of one campaign must see the same value.
pub fn job_ttr() -> Duration {
    static TTR: std::sync::LazyLock<Duration> = std::sync::LazyLock::new(|| {
        std::env::var("MAILSPLIT_LEASE_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&ms| ms >= 3_000)
            .map_or(JOB_TTR, Duration::from_millis)
    });
    *TTR
}
/// Scratch tube used to learn a server's newest job id.
const PROBE_TUBE: &str = "mailsplit-probe";
/// Prefix of a database's own tube, `mailsplit-<DATABASE-ID>` (see
/// [`home_tube`]).
const HOME_TUBE_PREFIX: &str = "mailsplit-";
/// Current job body version.
pub const JOB_VERSION: u32 = 2;

/// One job: a campaign and up to [`MAX_JOB_RECIPIENTS`] of its recipients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobBody {
    pub campaign: i64,
    pub recipients: Vec<i64>,
}

/// A job on the wire: `{"v":2,"db":"db-…","campaign":<id>,"recipients":[<id>,…],"mac":"…"}`.
/// `db` names the database the job belongs to (see `store::installation`);
/// `mac` signs `db`, `campaign` and `recipients` with that database's
/// secret, so a job put by hand is never trusted.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: u32,
    #[serde(default)]
    db: Option<String>,
    campaign: i64,
    recipients: Vec<i64>,
    #[serde(default)]
    mac: Option<String>,
}

/// Why a job body was rejected. [`BadJob::Foreign`] jobs are released for
/// the workers of their own database; every other kind is buried with this
/// in the log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadJob {
    #[error("body is not a mailsplit job: {0}")]
    Parse(String),
    #[error("unsupported job version {0} (this worker reads version {JOB_VERSION}; `mailsplit requeue` puts a campaign's unfinished recipients again)")]
    Version(u32),
    #[error("job belongs to database {0}, not this worker's")]
    Foreign(String),
    #[error("job signature is missing or wrong: not put by `mailsplit enqueue` for this database")]
    BadSignature,
    #[error("job has no recipients")]
    Empty,
    #[error("job has {0} recipients, more than the limit of {MAX_JOB_RECIPIENTS}")]
    TooMany(usize),
    #[error("job has a non-positive id ({0})")]
    BadId(i64),
}

impl JobBody {
    pub fn new(campaign: i64, recipients: Vec<i64>) -> JobBody {
        JobBody {
            campaign,
            recipients,
        }
    }

    /// The signed body for database `id`.
    pub fn encode(&self, id: &Identity) -> Vec<u8> {
        let wire = Wire {
            v: JOB_VERSION,
            db: Some(id.database_id.clone()),
            campaign: self.campaign,
            recipients: self.recipients.clone(),
            mac: Some(
                id.signer
                    .job_mac(&id.database_id, self.campaign, &self.recipients),
            ),
        };
        // Serialising integers and strings cannot fail.
        serde_json::to_vec(&wire).unwrap_or_default()
    }

    /// Parse and check a body that came over the wire: this database's,
    /// signed with its secret, with sane ids.
    pub fn decode(bytes: &[u8], id: &Identity) -> Result<JobBody, BadJob> {
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| BadJob::Parse(e.to_string()))?;
        if wire.v != JOB_VERSION {
            return Err(BadJob::Version(wire.v));
        }
        // Another database's job is checked by that database's workers,
        // under its own secret.
        match &wire.db {
            Some(db) if *db != id.database_id => return Err(BadJob::Foreign(db.clone())),
            _ => {}
        }
        let signed = wire.db.is_some()
            && wire.mac.as_deref().is_some_and(|mac| {
                id.signer
                    .verify_job(&id.database_id, wire.campaign, &wire.recipients, mac)
            });
        if !signed {
            return Err(BadJob::BadSignature);
        }
        if wire.recipients.is_empty() {
            return Err(BadJob::Empty);
        }
        if wire.recipients.len() > MAX_JOB_RECIPIENTS {
            return Err(BadJob::TooMany(wire.recipients.len()));
        }
        if let Some(&bad) = std::iter::once(&wire.campaign)
            .chain(&wire.recipients)
            .find(|&&id| id <= 0)
        {
            return Err(BadJob::BadId(bad));
        }
        Ok(JobBody {
            campaign: wire.campaign,
            recipients: wire.recipients,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot connect to beanstalkd at {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: BeanstalkcError,
    },
    #[error("beanstalkd at {addr}: {op} failed")]
    Command {
        addr: SocketAddr,
        op: &'static str,
        #[source]
        source: BeanstalkcError,
    },
    #[error("beanstalkd at {addr}: {op} failed")]
    Io {
        addr: SocketAddr,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("beanstalkd at {addr}: no answer to {op} within {after:?}")]
    TimedOut {
        addr: SocketAddr,
        op: &'static str,
        after: Duration,
    },
    #[error("beanstalkd at {addr}: unexpected answer to {op}: {reply:?}")]
    Unexpected {
        addr: SocketAddr,
        op: &'static str,
        reply: String,
    },
}

impl QueueError {
    /// The job is gone (already deleted, or its reservation lapsed).
    pub fn is_not_found(&self) -> bool {
        matches!(self, QueueError::Command { source: BeanstalkcError::CommandFailed(s), .. } if s == "NotFound")
    }
}

/// One job handed out by `reserve`.
#[derive(Debug)]
pub struct Reserved {
    pub id: u64,
    pub body: Vec<u8>,
}

/// One connection to one beanstalkd server.
pub struct Server {
    pub addr: SocketAddr,
    conn: Beanstalkc,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server({})", self.addr)
    }
}

impl Server {
    pub fn connect(addr: SocketAddr) -> Result<Server, QueueError> {
        let conn = Beanstalkc::new()
            .host(&addr.ip().to_string())
            .port(addr.port())
            .connection_timeout(Some(Duration::from_secs(5)))
            .connect()
            .map_err(|source| QueueError::Connect { addr, source })?;
        Ok(Server { addr, conn })
    }

    fn err(&self, op: &'static str) -> impl FnOnce(BeanstalkcError) -> QueueError {
        let addr = self.addr;
        move |source| QueueError::Command { addr, op, source }
    }

    /// Put new jobs into `tube`.
    pub fn use_tube(&mut self, tube: &str) -> Result<(), QueueError> {
        let e = self.err("use");
        self.conn.use_tube(tube).map(drop).map_err(e)
    }

    /// Reserve from `tube` only.
    pub fn watch_only(&mut self, tube: &str) -> Result<(), QueueError> {
        let e = self.err("watch");
        self.conn.watch(tube).map_err(e)?;
        if tube != "default" {
            let e = self.err("ignore");
            self.conn.ignore("default").map_err(e)?;
        }
        Ok(())
    }

    /// Reserve from `tube` too.
    pub fn watch(&mut self, tube: &str) -> Result<(), QueueError> {
        let e = self.err("watch");
        self.conn.watch(tube).map(drop).map_err(e)
    }

    /// A job's priority (`stats-job`).
    pub fn job_priority(&mut self, id: u64) -> Result<u32, QueueError> {
        let e = self.err("stats-job");
        let stats = self.conn.stats_job(id).map_err(e)?;
        Ok(stats
            .get("pri")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Move reserved job `id` (whose body is `body`) to `tube`: put a copy
    /// there with the same priority, then delete it here. New jobs go to
    /// `back_to` afterwards.
    pub fn move_job(
        &mut self,
        id: u64,
        body: &[u8],
        tube: &str,
        back_to: &str,
    ) -> Result<u64, QueueError> {
        let priority = self.job_priority(id)?;
        self.use_tube(tube)?;
        let put = self.put(body, priority);
        self.use_tube(back_to)?;
        let new = put?;
        self.delete(id)?;
        Ok(new)
    }

    pub fn put(&mut self, body: &[u8], priority: u32) -> Result<u64, QueueError> {
        let e = self.err("put");
        self.conn
            .put(body, priority, Duration::ZERO, job_ttr())
            .map_err(e)
    }

    /// Put a job that becomes ready after `delay`.
    pub fn put_delayed(
        &mut self,
        body: &[u8],
        priority: u32,
        delay: Duration,
    ) -> Result<u64, QueueError> {
        let e = self.err("put");
        self.conn.put(body, priority, delay, job_ttr()).map_err(e)
    }

    /// Wait up to `timeout` for a job; `None` when there was none.
    pub fn reserve(&mut self, timeout: Duration) -> Result<Option<Reserved>, QueueError> {
        let e = self.err("reserve");
        match self.conn.reserve_with_timeout(timeout) {
            Ok(job) => Ok(Some(Reserved {
                id: job.id(),
                body: job.body().to_vec(),
            })),
            // DEADLINE_SOON: one of our jobs nears its TTR. We touch on our
            // own clock (beanstalkd issue 646), so this is just "no job".
            Err(BeanstalkcError::CommandFailed(s)) if s == "TimedOut" || s == "DeadlineSoon" => {
                Ok(None)
            }
            Err(source) => Err(e(source)),
        }
    }

    pub fn delete(&mut self, id: u64) -> Result<(), QueueError> {
        let e = self.err("delete");
        self.conn.delete(id).map_err(e)
    }

    pub fn release(&mut self, id: u64, priority: u32, delay: Duration) -> Result<(), QueueError> {
        let e = self.err("release");
        self.conn.release(id, priority, delay).map_err(e)
    }

    pub fn bury(&mut self, id: u64, priority: u32) -> Result<(), QueueError> {
        let e = self.err("bury");
        self.conn.bury(id, priority).map_err(e)
    }

    pub fn touch(&mut self, id: u64) -> Result<(), QueueError> {
        let e = self.err("touch");
        self.conn.touch(id).map_err(e)
    }

    /// The body of any job by id, or `None` when no such job exists.
    pub fn peek(&mut self, id: u64) -> Result<Option<Vec<u8>>, QueueError> {
        let e = self.err("peek");
        match self.conn.peek(id) {
            Ok(job) => Ok(Some(job.body().to_vec())),
            Err(BeanstalkcError::CommandFailed(s)) if s == "NotFound" => Ok(None),
            Err(source) => Err(e(source)),
        }
    }

    /// The newest job id this server has handed out, learnt by putting and
    /// deleting a job in a scratch tube. Job ids only grow, so any job put
    /// later has a larger id.
    pub fn newest_job_id(&mut self, back_to_tube: &str) -> Result<u64, QueueError> {
        self.use_tube(PROBE_TUBE)?;
        let e = self.err("put");
        let id = self
            .conn
            .put(b"probe", u32::MAX, Duration::from_secs(3600), job_ttr())
            .map_err(e)?;
        self.delete(id)?;
        self.use_tube(back_to_tube)?;
        Ok(id)
    }
}

/// A database's own tube, `mailsplit-<DATABASE-ID>`: every worker watches
/// it besides the named tube (`--tube`), and a worker that reserves a job
/// of another database in a shared tube moves it at once to that
/// database's own tube, where only that database's workers look. `None`
/// for an id that cannot name a tube (a job body is not trusted).
pub fn home_tube(database_id: &str) -> Option<String> {
    let ok = !database_id.is_empty()
        && database_id.len() <= 64
        && database_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then(|| format!("{HOME_TUBE_PREFIX}{database_id}"))
}

/// The most urgent priority a campaign's jobs may have: the bands below it
/// are the messages' (transactional at [`message::MESSAGE_PRIORITY`], a
/// flow's batches at [`message::FLOW_PRIORITY`]), so a message overtakes
/// every campaign, whatever its `--priority`.
pub const CAMPAIGN_PRIORITY_MIN: u32 = 2;

/// beanstalkd priorities are u32, lower is more urgent; a campaign's never
/// enters the messages' bands.
pub fn priority(p: i64) -> u32 {
    p.clamp(CAMPAIGN_PRIORITY_MIN as i64, u32::MAX as i64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Signer;

    fn identity(db: &str, secret: u8) -> Identity {
        Identity {
            database_id: db.into(),
            signer: Signer::new(&[secret; 32]),
        }
    }

    #[test]
    fn job_bodies() {
        let id = identity("db-1", 1);
        let body = JobBody::new(7, vec![1, 2, 3]);
        let wire = String::from_utf8(body.encode(&id)).unwrap();
        assert!(
            wire.starts_with(r#"{"v":2,"db":"db-1","campaign":7,"recipients":[1,2,3],"mac":""#),
            "{wire}"
        );
        assert_eq!(JobBody::decode(wire.as_bytes(), &id), Ok(body));
        assert!(matches!(
            JobBody::decode(b"hello", &id),
            Err(BadJob::Parse(_))
        ));
        assert_eq!(
            JobBody::decode(br#"{"v":1,"campaign":1,"recipients":[1]}"#, &id),
            Err(BadJob::Version(1))
        );
        let many = JobBody::new(1, (1..=10_000).collect());
        assert_eq!(
            JobBody::decode(&many.encode(&id), &id),
            Err(BadJob::TooMany(10_000))
        );
        assert_eq!(
            JobBody::decode(&JobBody::new(1, vec![]).encode(&id), &id),
            Err(BadJob::Empty)
        );
        assert_eq!(
            JobBody::decode(&JobBody::new(1, vec![5, -3]).encode(&id), &id),
            Err(BadJob::BadId(-3))
        );
    }

    #[test]
    fn forged_and_foreign_jobs_are_told_apart() {
        let ours = identity("db-1", 1);
        // Put by hand: no signature, or a signature that does not match.
        for forged in [
            r#"{"v":2,"db":"db-1","campaign":1,"recipients":[1]}"#.to_string(),
            r#"{"v":2,"campaign":1,"recipients":[1],"mac":"AAAAAAAAAAAAAAAAAAAAAA"}"#.to_string(),
            String::from_utf8(JobBody::new(1, vec![1]).encode(&ours))
                .unwrap()
                .replace("[1]", "[2]"),
        ] {
            assert_eq!(
                JobBody::decode(forged.as_bytes(), &ours),
                Err(BadJob::BadSignature),
                "{forged}"
            );
        }
        // Same database id, another secret: forged too.
        let impostor = identity("db-1", 2);
        assert_eq!(
            JobBody::decode(&JobBody::new(1, vec![1]).encode(&impostor), &ours),
            Err(BadJob::BadSignature)
        );
        // Another database's genuine job: foreign, not forged.
        let theirs = identity("db-2", 2);
        assert_eq!(
            JobBody::decode(&JobBody::new(1, vec![1]).encode(&theirs), &ours),
            Err(BadJob::Foreign("db-2".into()))
        );
    }
}
