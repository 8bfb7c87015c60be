//! A small beanstalkd client for the few commands `serve`, `resume` and
//! the sweep for lost message jobs need (`stats-tube`, `list-tube-used`,
//! `use`, `peek-delayed`, `kick-job`, `pause-tube`, `peek-ready`,
//! `stats-job`), each under a deadline. The `beanstalkc` crate sets no
//! socket timeouts and does not expose its socket, so a server that
//! accepts and never answers would hold a thread for ever (and a polling
//! dashboard one more every few seconds). Here every reply must
//! arrive whole within the deadline of its command, however the server
//! trickles it, or the command fails with [`QueueError::TimedOut`].

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::QueueError;

/// Longest reply line read (beanstalkd's are a few dozen bytes).
const MAX_LINE: usize = 1024;
/// Largest job body read by [`Timed::ready_head`] (beanstalkd's own limit
/// is 64 KiB unless raised; mailsplit's jobs are a few KiB).
const MAX_BODY: usize = 1 << 20;
/// Largest `stats-tube` document read (beanstalkd's is under 1 KB).
const MAX_STATS: usize = 64 * 1024;
/// How long a kick of delayed jobs pauses their tube for reservations at
/// most (renewed while the kick goes on): short, because every job of the
/// tube waits that long should the kicking connection die.
const KICK_PAUSE: Duration = Duration::from_secs(2);

/// The job at the head of a tube's ready queue (see [`Timed::ready_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyJob {
    pub body: Vec<u8>,
    /// How long ago it was put (`stats-job`'s `age`, whole seconds rounded
    /// down); `None` when it was reserved or deleted between the looks.
    pub age: Option<Duration>,
}

/// One connection whose every command answers within `timeout` or fails.
pub struct Timed {
    addr: SocketAddr,
    timeout: Duration,
    reader: BufReader<TcpStream>,
}

impl Timed {
    /// Connect within `timeout`; each command then gets `timeout` too.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Timed, QueueError> {
        let stream =
            TcpStream::connect_timeout(&addr, timeout).map_err(|source| QueueError::Io {
                addr,
                op: "connect",
                source,
            })?;
        // Best effort: each command is one small write.
        let _ = stream.set_nodelay(true);
        Ok(Timed {
            addr,
            timeout,
            reader: BufReader::new(stream),
        })
    }

    fn io(&self, op: &'static str) -> impl Fn(std::io::Error) -> QueueError {
        let (addr, after) = (self.addr, self.timeout);
        move |source| match source.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => QueueError::TimedOut { addr, op, after },
            _ => QueueError::Io { addr, op, source },
        }
    }

    fn unexpected(&self, op: &'static str, reply: &str) -> QueueError {
        QueueError::Unexpected {
            addr: self.addr,
            op,
            reply: crate::store::clip_line(reply, 80),
        }
    }

    /// Arm the socket for what is left until `deadline`.
    fn arm(&self, op: &'static str, deadline: Instant) -> Result<(), QueueError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.io(op)(ErrorKind::TimedOut.into()));
        }
        let s = self.reader.get_ref();
        s.set_read_timeout(Some(left))
            .and_then(|()| s.set_write_timeout(Some(left)))
            .map_err(self.io(op))
    }

    /// Send one command line; returns its reply line (without CRLF) and
    /// the command's deadline, for a data block that may follow.
    fn command(&mut self, op: &'static str, line: &str) -> Result<(String, Instant), QueueError> {
        let deadline = Instant::now() + self.timeout;
        self.arm(op, deadline)?;
        let wire = format!("{line}\r\n");
        self.reader
            .get_mut()
            .write_all(wire.as_bytes())
            .map_err(self.io(op))?;
        let mut reply = Vec::new();
        loop {
            self.arm(op, deadline)?;
            let failed = self.io(op);
            let buf = self.reader.fill_buf().map_err(failed)?;
            if buf.is_empty() {
                return Err(self.io(op)(ErrorKind::UnexpectedEof.into()));
            }
            let (take, done) = match memchr::memchr(b'\n', buf) {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            reply.extend_from_slice(&buf[..take]);
            self.reader.consume(take);
            if done {
                break;
            }
            if reply.len() > MAX_LINE {
                return Err(self.unexpected(op, &String::from_utf8_lossy(&reply)));
            }
        }
        let reply = String::from_utf8_lossy(&reply).trim_end().to_string();
        Ok((reply, deadline))
    }

    /// Read a data block of `len` bytes and its CRLF; kept only if `keep`.
    fn data(
        &mut self,
        op: &'static str,
        len: usize,
        deadline: Instant,
        keep: bool,
    ) -> Result<Vec<u8>, QueueError> {
        let mut out = Vec::with_capacity(if keep { len } else { 0 });
        let mut left = len + 2;
        let mut chunk = [0u8; 8192];
        while left > 0 {
            self.arm(op, deadline)?;
            let n = self
                .reader
                .read(&mut chunk[..left.min(8192)])
                .map_err(self.io(op))?;
            if n == 0 {
                return Err(self.io(op)(ErrorKind::UnexpectedEof.into()));
            }
            if keep {
                out.extend_from_slice(&chunk[..n]);
            }
            left -= n;
        }
        out.truncate(len);
        Ok(out)
    }

    /// The server answers at all (`list-tube-used`).
    pub fn ping(&mut self) -> Result<(), QueueError> {
        let (reply, _) = self.command("list-tube-used", "list-tube-used")?;
        if reply.starts_with("USING ") {
            Ok(())
        } else {
            Err(self.unexpected("list-tube-used", &reply))
        }
    }

    /// Statistics of a tube (`current-jobs-ready`, …); empty if it has none.
    pub fn stats_tube(&mut self, tube: &str) -> Result<HashMap<String, String>, QueueError> {
        const OP: &str = "stats-tube";
        let (reply, deadline) = self.command(OP, &format!("stats-tube {tube}"))?;
        if reply == "NOT_FOUND" {
            return Ok(HashMap::new());
        }
        let len = reply
            .strip_prefix("OK ")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n <= MAX_STATS)
            .ok_or_else(|| self.unexpected(OP, &reply))?;
        let yaml = self.data(OP, len, deadline, true)?;
        Ok(String::from_utf8_lossy(&yaml)
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect())
    }

    /// Make every delayed job of `tube` ready now (at most `limit`): what
    /// `resume` does so a paused campaign's jobs need not sit out their
    /// release delay. Returns how many were kicked.
    ///
    /// The tube is paused for reservations while the jobs are kicked: a
    /// worker that took a kicked job could release it with a delay (a start
    /// still a moment ahead) before the last `peek-delayed`, which would
    /// find and kick it again, and again, as long as the worker keeps up,
    /// each time costing a release. Paused, each delayed job is kicked
    /// once. Should this connection die halfway, the pause lapses by
    /// itself after [`KICK_PAUSE`].
    pub fn kick_delayed(&mut self, tube: &str, limit: u64) -> Result<u64, QueueError> {
        let (reply, _) = self.command("use", &format!("use {tube}"))?;
        if !reply.starts_with("USING ") {
            return Err(self.unexpected("use", &reply));
        }
        self.pause_tube(tube, KICK_PAUSE)?;
        let mut paused_at = Instant::now();
        let kicked = self.kick_paused(tube, limit, &mut paused_at);
        // Lifted even when the kick failed: the tube's other jobs wait for
        // nobody. If this fails too, the pause lapses on its own.
        let lifted = self.pause_tube(tube, Duration::ZERO);
        let kicked = kicked?;
        lifted?;
        Ok(kicked)
    }

    /// The job a worker would reserve next from `tube` (`peek-ready`);
    /// `None` when no job of `tube` is ready.
    pub fn ready_head(&mut self, tube: &str) -> Result<Option<ReadyJob>, QueueError> {
        let (reply, _) = self.command("use", &format!("use {tube}"))?;
        if !reply.starts_with("USING ") {
            return Err(self.unexpected("use", &reply));
        }
        let (reply, deadline) = self.command("peek-ready", "peek-ready")?;
        if reply == "NOT_FOUND" {
            return Ok(None);
        }
        let Some((id, len)) = found(&reply).filter(|&(_, len)| len <= MAX_BODY) else {
            return Err(self.unexpected("peek-ready", &reply));
        };
        let body = self.data("peek-ready", len, deadline, true)?;
        let (reply, deadline) = self.command("stats-job", &format!("stats-job {id}"))?;
        if reply == "NOT_FOUND" {
            return Ok(Some(ReadyJob { body, age: None }));
        }
        let len = reply
            .strip_prefix("OK ")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n <= MAX_STATS)
            .ok_or_else(|| self.unexpected("stats-job", &reply))?;
        let yaml = self.data("stats-job", len, deadline, true)?;
        let age = String::from_utf8_lossy(&yaml)
            .lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(k, _)| k.trim() == "age")
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        Ok(Some(ReadyJob { body, age }))
    }

    /// `pause-tube`: no job of `tube` is reserved for `d` (whole seconds;
    /// zero lifts a pause at once).
    fn pause_tube(&mut self, tube: &str, d: Duration) -> Result<(), QueueError> {
        let (reply, _) =
            self.command("pause-tube", &format!("pause-tube {tube} {}", d.as_secs()))?;
        match reply.as_str() {
            // The tube went away: it holds no job to kick.
            "PAUSED" | "NOT_FOUND" => Ok(()),
            _ => Err(self.unexpected("pause-tube", &reply)),
        }
    }

    /// The kick loop of [`Timed::kick_delayed`], with the tube paused; the
    /// pause is renewed before it can lapse, so a long kick stays paused.
    fn kick_paused(
        &mut self,
        tube: &str,
        limit: u64,
        paused_at: &mut Instant,
    ) -> Result<u64, QueueError> {
        let mut kicked = 0;
        while kicked < limit {
            if paused_at.elapsed() >= KICK_PAUSE / 2 {
                self.pause_tube(tube, KICK_PAUSE)?;
                *paused_at = Instant::now();
            }
            let (reply, deadline) = self.command("peek-delayed", "peek-delayed")?;
            if reply == "NOT_FOUND" {
                break;
            }
            let Some((id, len)) = found(&reply) else {
                return Err(self.unexpected("peek-delayed", &reply));
            };
            self.data("peek-delayed", len, deadline, false)?;
            let (reply, _) = self.command("kick-job", &format!("kick-job {id}"))?;
            match reply.as_str() {
                "KICKED" => kicked += 1,
                // Reserved or deleted between the peek and the kick.
                "NOT_FOUND" => {}
                _ => return Err(self.unexpected("kick-job", &reply)),
            }
        }
        Ok(kicked)
    }
}

/// `FOUND <id> <bytes>`.
fn found(reply: &str) -> Option<(u64, usize)> {
    let mut words = reply.strip_prefix("FOUND ")?.split(' ');
    let id = words.next()?.parse().ok()?;
    let len = words.next()?.parse().ok()?;
    Some((id, len))
}
