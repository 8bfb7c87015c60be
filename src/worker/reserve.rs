//! The reserve stage: one OS thread per beanstalkd server, owning that
//! server's connection (beanstalkc is blocking, and a reserved job can only
//! be deleted, released, buried or touched on the connection that reserved
//! it). The thread reserves while a job slot is free, hands jobs to the async
//! side, and carries out the commands that come back.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::queue::{QueueError, Server};

/// Longest a reserve blocks when the thread holds no job, so a stop is
/// noticed within this time.
const IDLE_RESERVE: Duration = Duration::from_secs(1);
/// Wait for commands between non-blocking reserves while holding jobs.
const BUSY_POLL: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A reserved job on its way to the job stage.
pub struct Incoming {
    pub server: usize,
    pub id: u64,
    pub body: Vec<u8>,
    /// One of the worker's job slots; dropped when the job is finished.
    pub permit: OwnedSemaphorePermit,
}

/// What the job stage wants done to a reserved job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    Delete(u64),
    Release {
        id: u64,
        priority: u32,
        delay: Duration,
    },
    Bury {
        id: u64,
        priority: u32,
    },
    Touch(u64),
    /// A job of another database: move it to that database's own tube
    /// (see [`crate::queue::home_tube`]); if that fails, release it with
    /// `delay`.
    Move {
        id: u64,
        body: Vec<u8>,
        tube: String,
        delay: Duration,
    },
    /// Put `jobs` (the job's deferred recipients) into the tube, then
    /// delete the job; if a put fails, release the job with `delay` (the
    /// longest) instead.
    Defer {
        id: u64,
        priority: u32,
        delay: Duration,
        jobs: Vec<NewJob>,
    },
}

/// A job to put, delayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub delay: Duration,
    pub body: Vec<u8>,
}

impl Cmd {
    fn id(&self) -> u64 {
        match *self {
            Cmd::Delete(id) | Cmd::Touch(id) => id,
            Cmd::Release { id, .. }
            | Cmd::Bury { id, .. }
            | Cmd::Defer { id, .. }
            | Cmd::Move { id, .. } => id,
        }
    }
}

pub struct ServerLoop {
    pub index: usize,
    pub addr: SocketAddr,
    pub tube: String,
    /// This database's own tube, watched besides `tube` (other databases'
    /// workers move its jobs there).
    pub home: Option<String>,
    pub jobs: mpsc::Sender<Incoming>,
    pub cmds: Receiver<Cmd>,
    pub slots: Arc<Semaphore>,
    pub stop: CancellationToken,
    /// Set once every job is finished: the thread may leave.
    pub drained: CancellationToken,
}

impl ServerLoop {
    /// Run until stopped and drained. Connection losses are retried with a
    /// doubling, capped delay; jobs reserved on a lost connection are back
    /// in beanstalkd's ready queue already, so commands for them are dropped.
    pub fn run(self) {
        let mut backoff = Duration::from_millis(250);
        let mut held: HashSet<u64> = HashSet::new();
        let mut server: Option<Server> = None;
        loop {
            if self.drained.is_cancelled() {
                // Carry out what is queued, then leave.
                if let Some(s) = server.as_mut() {
                    while let Ok(cmd) = self.cmds.try_recv() {
                        let _ = self.apply(s, &mut held, cmd);
                    }
                }
                return;
            }
            let Some(s) = server.as_mut() else {
                match self.connect() {
                    Ok(s) => {
                        if backoff > Duration::from_millis(250) {
                            tracing::info!(beanstalkd = %self.addr, "reconnected");
                        }
                        backoff = Duration::from_millis(250);
                        server = Some(s);
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), retry_in = ?backoff, "beanstalkd unavailable");
                        self.sleep_or_drain(backoff);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                continue;
            };
            if let Err(e) = self.step(s, &mut held) {
                tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), "lost beanstalkd connection; its reserved jobs return to the queue");
                server = None;
                held.clear();
            }
        }
    }

    fn connect(&self) -> Result<Server, QueueError> {
        let mut s = Server::connect(self.addr)?;
        s.watch_only(&self.tube)?;
        if let Some(home) = self.home.as_deref().filter(|h| *h != self.tube) {
            s.watch(home)?;
        }
        // Deferred recipients are put into the same tube.
        s.use_tube(&self.tube)?;
        Ok(s)
    }

    fn sleep_or_drain(&self, d: Duration) {
        let step = Duration::from_millis(100);
        let mut left = d;
        while !left.is_zero() && !self.drained.is_cancelled() {
            std::thread::sleep(step.min(left));
            left = left.saturating_sub(step);
        }
    }

    /// Apply queued commands, then reserve one job if a slot is free.
    fn step(&self, s: &mut Server, held: &mut HashSet<u64>) -> Result<(), QueueError> {
        while let Ok(cmd) = self.cmds.try_recv() {
            self.apply(s, held, cmd)?;
        }
        let permit = if self.stop.is_cancelled() {
            None
        } else {
            self.slots.clone().try_acquire_owned().ok()
        };
        let Some(permit) = permit else {
            return self.wait_cmd(s, held, BUSY_POLL * 5);
        };
        let timeout = if held.is_empty() {
            IDLE_RESERVE
        } else {
            Duration::ZERO
        };
        match s.reserve(timeout)? {
            Some(job) => {
                held.insert(job.id);
                let incoming = Incoming {
                    server: self.index,
                    id: job.id,
                    body: job.body,
                    permit,
                };
                if self.jobs.blocking_send(incoming).is_err() {
                    // The job stage is gone (shutting down): hand it back.
                    held.remove(&job.id);
                    s.release(job.id, 0, Duration::ZERO)?;
                }
                Ok(())
            }
            None if held.is_empty() => Ok(()),
            None => {
                drop(permit);
                self.wait_cmd(s, held, BUSY_POLL)
            }
        }
    }

    fn wait_cmd(
        &self,
        s: &mut Server,
        held: &mut HashSet<u64>,
        wait: Duration,
    ) -> Result<(), QueueError> {
        match self.cmds.recv_timeout(wait) {
            Ok(cmd) => self.apply(s, held, cmd),
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(wait);
                Ok(())
            }
        }
    }

    /// Move job `id` of another database to its own tube; when the move
    /// fails for any reason but the job being gone, release it instead.
    fn move_or_release(
        &self,
        s: &mut Server,
        id: u64,
        body: &[u8],
        tube: &str,
        delay: Duration,
    ) -> Result<(), QueueError> {
        match s.move_job(id, body, tube, &self.tube) {
            Ok(new) => {
                tracing::debug!(job = id, new_job = new, %tube, "job of another database moved to its own tube");
                Ok(())
            }
            Err(e) if e.is_not_found() => Err(e),
            Err(e) => {
                tracing::warn!(job = id, %tube, error = %format!("{:#}", anyhow::Error::from(e)), "cannot move a job of another database to its own tube: releasing it instead");
                s.release(id, 0, delay)
            }
        }
    }

    fn apply(&self, s: &mut Server, held: &mut HashSet<u64>, cmd: Cmd) -> Result<(), QueueError> {
        let id = cmd.id();
        if !held.contains(&id) {
            // Reserved on a connection since lost: beanstalkd has it again.
            return Ok(());
        }
        let touch = matches!(cmd, Cmd::Touch(_));
        let result = match cmd {
            Cmd::Delete(id) => s.delete(id),
            Cmd::Release {
                id,
                priority,
                delay,
            } => s.release(id, priority, delay),
            Cmd::Bury { id, priority } => s.bury(id, priority),
            Cmd::Touch(id) => s.touch(id),
            Cmd::Move {
                id,
                body,
                tube,
                delay,
            } => self.move_or_release(s, id, &body, &tube, delay),
            Cmd::Defer {
                id,
                priority,
                delay,
                jobs,
            } => match put_jobs(s, id, priority, &jobs) {
                Ok(()) => s.delete(id),
                // If the connection is gone, so is the reservation and
                // the release fails too: the job is back in the queue whole.
                // Jobs put before the failure hold some of its recipients
                // twice over; the ledger's claim sends each once.
                Err(e) => {
                    tracing::warn!(job = id, error = %format!("{:#}", anyhow::Error::from(e)), "cannot put deferred recipients in a new job: releasing the job instead");
                    s.release(id, priority, delay)
                }
            },
        };
        if !touch {
            held.remove(&id);
        }
        match result {
            Err(e) if e.is_not_found() => {
                tracing::warn!(job = id, beanstalkd = %self.addr, "job no longer reserved by us (TTR passed?)");
                held.remove(&id);
                Ok(())
            }
            other => other,
        }
    }
}

/// Put job `id`'s deferred recipients into their new jobs.
fn put_jobs(s: &mut Server, id: u64, priority: u32, jobs: &[NewJob]) -> Result<(), QueueError> {
    for j in jobs {
        let new = s.put_delayed(&j.body, priority, j.delay)?;
        tracing::debug!(job = id, new_job = new, delay = ?j.delay, "deferred recipients put in a new job");
    }
    Ok(())
}
