//! Test helpers: real servers on free ports (beanstalkd, Postfix's
//! smtp-sink, a scripted SMTP peer for faults), a fresh SQLite file or
//! PostgreSQL database per test, and a builder for running the binary.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_mailsplit");

/// `both!(scenario, …)`: for each `fn scenario(Kind)`, a `#[test]` per
/// backend, `sqlite::scenario` and `postgres::scenario`.
#[macro_export]
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(super::Kind::Sqlite) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name(super::Kind::Postgres) } )*
        }
    };
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// Wait until something accepts TCP connections on `port`.
pub fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait for `cond` for up to `secs` seconds.
pub fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed when dropped.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Beanstalkd {
    pub port: u16,
    pub binlog: PathBuf,
    proc: Option<Proc>,
}

impl Beanstalkd {
    pub fn start(dir: &Path) -> Beanstalkd {
        let mut b = Beanstalkd {
            port: free_port(),
            binlog: dir.join(format!("binlog-{}", free_port())),
            proc: None,
        };
        std::fs::create_dir_all(&b.binlog).unwrap();
        b.restart();
        b
    }
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    pub fn stop(&mut self) {
        self.proc = None;
    }
    /// Start again on the same port with the same binlog.
    pub fn restart(&mut self) {
        self.proc = None;
        let child = Command::new("beanstalkd")
            .args(["-l", "127.0.0.1", "-p", &self.port.to_string(), "-b"])
            .arg(&self.binlog)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("beanstalkd is not installed: run scripts/install-deps.sh");
        self.proc = Some(Proc(child));
        wait_port(self.port);
    }
    pub fn client(&self) -> beanstalkc::Beanstalkc {
        beanstalkc::Beanstalkc::new()
            .host("127.0.0.1")
            .port(self.port)
            .connect()
            .unwrap()
    }
    /// `stats-tube` counters of a tube (0 when the tube does not exist).
    pub fn tube_stat(&self, tube: &str, key: &str) -> u64 {
        match self.client().stats_tube(tube) {
            Ok(m) => m.get(key).and_then(|v| v.parse().ok()).unwrap_or(0),
            Err(_) => 0,
        }
    }
    /// Reserve and delete every ready job of `tube`, returning the bodies.
    pub fn drain(&self, tube: &str) -> Vec<(u32, String)> {
        let mut c = self.client();
        c.watch(tube).unwrap();
        c.ignore("default").unwrap();
        let mut out = Vec::new();
        while let Ok((id, body)) = c
            .reserve_with_timeout(Duration::ZERO)
            .map(|job| (job.id(), String::from_utf8(job.body().to_vec()).unwrap()))
        {
            let pri = c
                .stats_job(id)
                .unwrap()
                .get("pri")
                .and_then(|p| p.parse().ok())
                .unwrap();
            c.delete(id).unwrap();
            out.push((pri, body));
        }
        out
    }
}

/// Postfix's smtp-sink: accepts everything, as fast as it can.
pub struct SmtpSink {
    pub port: u16,
    _proc: Proc,
}

impl SmtpSink {
    pub fn start(extra: &[&str]) -> SmtpSink {
        let port = free_port();
        let child = Command::new("/usr/sbin/smtp-sink")
            .args(extra)
            .args(["-u", "nobody", &format!("127.0.0.1:{port}"), "1000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("smtp-sink is not installed: run scripts/install-deps.sh");
        wait_port(port);
        SmtpSink {
            port,
            _proc: Proc(child),
        }
    }
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }
}

/// TLS offered by the scripted peer.
#[derive(Clone, Default)]
pub enum PeerTls {
    #[default]
    None,
    /// Advertise STARTTLS and upgrade when asked.
    StartTls(Arc<rustls::ServerConfig>),
    /// TLS from the first byte (smtps).
    Implicit(Arc<rustls::ServerConfig>),
}

/// A self-signed certificate for `localhost`: the server config, and the
/// certificate's PEM written to `dir` for the client to trust.
pub fn tls_identity(dir: &Path) -> (Arc<rustls::ServerConfig>, PathBuf) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let pem = dir.join("ca.pem");
    std::fs::write(&pem, cert.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    (Arc::new(config), pem)
}

/// What the scripted SMTP peer does with a recipient address.
#[derive(Clone, Default)]
pub struct Script {
    pub tls: PeerTls,
    /// Addresses containing this get `451` on their first N tries.
    pub tempfail: Option<(String, u32)>,
    /// Addresses containing this get `550` every time.
    pub reject: Option<String>,
    /// Delay before answering the end of DATA.
    pub data_delay: Duration,
    /// Every k-th address (chosen by [`picked`]) gets `451` on its first try.
    pub tempfail_every: Option<u32>,
    /// Every k-th address (chosen by [`picked`]) gets `550` every time.
    pub reject_every: Option<u32>,
    /// Every k-th address, first try: `421 4.7.0 slow down` at RCPT, then
    /// the peer closes the connection.
    pub slow_down_every: Option<u32>,
    /// Every k-th address, first try: the peer reads the whole message after
    /// DATA, then closes the connection without answering and without
    /// accepting it.
    pub disconnect_in_data_every: Option<u32>,
    /// Every k-th address, first try: the peer accepts the message (it counts
    /// in `received`, and in `unanswered`), then closes the connection before
    /// answering the final dot. The client cannot tell it was delivered, so
    /// a second copy is legitimate.
    pub accept_then_disconnect_every: Option<u32>,
    /// While set, the peer stops answering (no greeting, no replies) but
    /// keeps its connections open; a session caught in it is closed, without
    /// accepting anything, once it is cleared.
    pub hang: Arc<AtomicBool>,
    /// Keep every accepted message's envelope recipients and text in
    /// `messages`.
    pub keep_data: bool,
    /// The reply to rejected recipients (`reject`, `reject_every`) instead
    /// of `550 5.1.1 no such user here`, e.g. a relay's policy refusal.
    pub reject_reply: Option<String>,
    /// Offer AUTH (PLAIN, LOGIN) and accept only this user and password;
    /// MAIL before a successful AUTH gets 530. Every try is kept in
    /// `auths`.
    pub auth: Option<(String, String)>,
    /// Do not advertise SMTPUTF8, and refuse what would need it (a
    /// non-ASCII address in MAIL FROM or RCPT TO, the SMTPUTF8 parameter),
    /// as a relay without it does.
    pub no_smtputf8: bool,
    /// Greet at most this many sessions at once, as a relay at its process
    /// limit does: a further connection is accepted but not greeted until
    /// one of them ends (QUIT or close).
    pub max_greeted: Option<usize>,
    /// Advertise PIPELINING (RFC 2920).
    pub pipelining: bool,
    /// Recipients whose address contains the pattern get this reply at
    /// RCPT, every time (e.g. `452 4.2.2 mailbox full`).
    pub rcpt_replies: Vec<(String, String)>,
}

/// Sessions a [`Script::max_greeted`] peer has greeted, and how many
/// connections it has (greeted or waiting).
#[derive(Default)]
struct Gate {
    counts: Mutex<(usize, usize)>,
    changed: std::sync::Condvar,
}

/// How one session with the scripted peer went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionEnd {
    /// Messages accepted in it.
    pub messages: u32,
    /// The client ended it with QUIT.
    pub quit: bool,
}

/// One AUTH exchange the scripted peer saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthTry {
    pub user: String,
    pub password: String,
    /// Over TLS (implicit or after STARTTLS).
    pub encrypted: bool,
    pub accepted: bool,
}

/// Whether the fault `salt`, applied to every `every`-th address, hits
/// `addr`: a stable hash, so a test can tell which addresses were hit.
pub fn picked(addr: &str, salt: &str, every: Option<u32>) -> bool {
    let Some(every) = every.filter(|&k| k > 0) else {
        return false;
    };
    // FNV-1a over salt and address.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in salt.bytes().chain([0]).chain(addr.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.is_multiple_of(u64::from(every))
}

/// Salts of the fractional faults, for [`picked`].
pub const TEMPFAIL: &str = "tempfail";
pub const REJECT: &str = "reject";
pub const SLOW_DOWN: &str = "slow-down";
pub const DISCONNECT_IN_DATA: &str = "disconnect-in-data";
pub const ACCEPT_THEN_DISCONNECT: &str = "accept-then-disconnect";

/// An accepted message: its envelope recipients and its text.
pub type Accepted = (Vec<String>, String);

/// A small SMTP server of our own that records every accepted message's
/// recipients and injects faults as scripted.
pub struct ScriptedSmtp {
    pub port: u16,
    /// Accepted deliveries per address.
    pub received: Arc<Mutex<HashMap<String, u32>>>,
    /// RCPT attempts per address.
    pub tries: Arc<Mutex<HashMap<String, u32>>>,
    pub sessions: Arc<AtomicUsize>,
    /// Messages accepted over an encrypted session.
    pub encrypted: Arc<AtomicUsize>,
    /// When each accepted recipient was accepted.
    pub log: Arc<Mutex<Vec<(Instant, String)>>>,
    /// Messages accepted but never answered (`accept_then_disconnect_every`),
    /// per address.
    pub unanswered: Arc<Mutex<HashMap<String, u32>>>,
    /// Injected faults of every kind (each answered or unanswered fault once).
    pub faults: Arc<AtomicUsize>,
    /// Accepted messages (with `keep_data`): envelope recipients and text.
    pub messages: Arc<Mutex<Vec<Accepted>>>,
    /// The envelope sender (MAIL FROM) of each accepted recipient's last
    /// message.
    pub senders: Arc<Mutex<HashMap<String, String>>>,
    /// Every AUTH exchange, in order.
    pub auths: Arc<Mutex<Vec<AuthTry>>>,
    /// Most connections open at once (greeted or waiting to be).
    pub peak_connections: Arc<AtomicUsize>,
    /// Connections left waiting for the greeting (over `max_greeted`) for
    /// more than 100 ms.
    pub ungreeted: Arc<AtomicUsize>,
    /// Every finished session.
    pub session_ends: Arc<Mutex<Vec<SessionEnd>>>,
    /// MAIL commands, and those whose RCPT and DATA had already arrived
    /// when the peer read the MAIL (sent in one flight, before any reply).
    pub mails: Arc<AtomicUsize>,
    pub mails_in_one_flight: Arc<AtomicUsize>,
    /// RSET commands.
    pub resets: Arc<AtomicUsize>,
}

impl ScriptedSmtp {
    pub fn start(script: Script) -> ScriptedSmtp {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = ScriptedSmtp {
            port,
            received: Default::default(),
            tries: Default::default(),
            sessions: Default::default(),
            encrypted: Default::default(),
            log: Default::default(),
            unanswered: Default::default(),
            faults: Default::default(),
            messages: Default::default(),
            senders: Default::default(),
            auths: Default::default(),
            peak_connections: Default::default(),
            ungreeted: Default::default(),
            session_ends: Default::default(),
            mails: Default::default(),
            mails_in_one_flight: Default::default(),
            resets: Default::default(),
        };
        let gate = Arc::new(Gate::default());
        let (peak, ungreeted, ends) = (
            peer.peak_connections.clone(),
            peer.ungreeted.clone(),
            peer.session_ends.clone(),
        );
        let auths = peer.auths.clone();
        let (mails, flights, resets) = (
            peer.mails.clone(),
            peer.mails_in_one_flight.clone(),
            peer.resets.clone(),
        );
        let (unanswered, faults, messages, senders) = (
            peer.unanswered.clone(),
            peer.faults.clone(),
            peer.messages.clone(),
            peer.senders.clone(),
        );
        let (received, tries, sessions, encrypted, log) = (
            peer.received.clone(),
            peer.tries.clone(),
            peer.sessions.clone(),
            peer.encrypted.clone(),
            peer.log.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Peer {
                    script: script.clone(),
                    received: received.clone(),
                    tries: tries.clone(),
                    encrypted: encrypted.clone(),
                    log: log.clone(),
                    unanswered: unanswered.clone(),
                    faults: faults.clone(),
                    messages: messages.clone(),
                    senders: senders.clone(),
                    auths: auths.clone(),
                    gate: gate.clone(),
                    left: Default::default(),
                    delivered: Default::default(),
                    quit: Default::default(),
                    mails: mails.clone(),
                    flights: flights.clone(),
                    resets: resets.clone(),
                };
                sessions.fetch_add(1, Ordering::SeqCst);
                {
                    let mut c = gate.counts.lock().unwrap();
                    c.1 += 1;
                    peak.fetch_max(c.1, Ordering::SeqCst);
                }
                let (ungreeted, ends) = (ungreeted.clone(), ends.clone());
                std::thread::spawn(move || {
                    if let Some(n) = state.script.max_greeted {
                        let since = Instant::now();
                        let mut c = state.gate.counts.lock().unwrap();
                        while c.0 >= n {
                            c = state.gate.changed.wait(c).unwrap();
                        }
                        c.0 += 1;
                        if since.elapsed() > Duration::from_millis(100) {
                            ungreeted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _ = state.session(stream);
                    state.leave();
                    ends.lock().unwrap().push(SessionEnd {
                        messages: state.delivered.get(),
                        quit: state.quit.get(),
                    });
                });
            }
        });
        peer
    }
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }
    pub fn total(&self) -> u32 {
        self.received.lock().unwrap().values().sum()
    }
    pub fn duplicates(&self) -> usize {
        self.received
            .lock()
            .unwrap()
            .values()
            .filter(|&&n| n > 1)
            .count()
    }
    pub fn count(&self, addr: &str) -> u32 {
        *self.received.lock().unwrap().get(addr).unwrap_or(&0)
    }
}

struct Peer {
    script: Script,
    received: Arc<Mutex<HashMap<String, u32>>>,
    tries: Arc<Mutex<HashMap<String, u32>>>,
    encrypted: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<(Instant, String)>>>,
    unanswered: Arc<Mutex<HashMap<String, u32>>>,
    faults: Arc<AtomicUsize>,
    messages: Arc<Mutex<Vec<Accepted>>>,
    senders: Arc<Mutex<HashMap<String, String>>>,
    auths: Arc<Mutex<Vec<AuthTry>>>,
    gate: Arc<Gate>,
    /// This session no longer counts in `gate`.
    left: std::cell::Cell<bool>,
    delivered: std::cell::Cell<u32>,
    quit: std::cell::Cell<bool>,
    mails: Arc<AtomicUsize>,
    flights: Arc<AtomicUsize>,
    resets: Arc<AtomicUsize>,
}

impl Peer {
    /// The session ends: it no longer counts against `max_greeted` (at
    /// QUIT, before the reply, so the client's next session never sees it).
    fn leave(&self) {
        if self.left.replace(true) {
            return;
        }
        let mut c = self.gate.counts.lock().unwrap();
        c.1 -= 1;
        if self.script.max_greeted.is_some() {
            c.0 -= 1;
        }
        self.gate.changed.notify_all();
    }
}

/// Base64 text from an AUTH exchange, decoded (empty when it is not).
fn unbase64(text: &str) -> String {
    data_encoding::BASE64
        .decode(text.trim().as_bytes())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

impl Peer {
    /// One AUTH exchange after the `AUTH …` line: read the credentials
    /// (PLAIN, inline or after a 334; LOGIN), answer 235 or 535, and keep
    /// the try. True when accepted.
    fn auth<S: std::io::Read + Write>(
        &self,
        io: &mut BufReader<S>,
        line: &str,
        encrypted: bool,
    ) -> std::io::Result<bool> {
        let mut words = line.split_whitespace().skip(1);
        let mechanism = words.next().unwrap_or_default().to_ascii_uppercase();
        let ask = |io: &mut BufReader<S>, prompt: &[u8]| -> std::io::Result<String> {
            io.get_mut().write_all(prompt)?;
            io.get_mut().flush()?;
            let mut answer = String::new();
            io.read_line(&mut answer)?;
            Ok(unbase64(&answer))
        };
        let (user, password) = match mechanism.as_str() {
            "PLAIN" => {
                let plain = match words.next() {
                    Some(inline) => unbase64(inline),
                    None => ask(io, b"334 \r\n")?,
                };
                let mut parts = plain.split('\0').skip(1);
                (
                    parts.next().unwrap_or_default().to_string(),
                    parts.next().unwrap_or_default().to_string(),
                )
            }
            "LOGIN" => {
                let user = ask(io, b"334 VXNlcm5hbWU6\r\n")?;
                (user, ask(io, b"334 UGFzc3dvcmQ6\r\n")?)
            }
            _ => {
                io.get_mut().write_all(b"504 5.5.4 unknown mechanism\r\n")?;
                return Ok(false);
            }
        };
        let accepted = self
            .script
            .auth
            .as_ref()
            .is_some_and(|(u, p)| *u == user && *p == password);
        self.auths.lock().unwrap().push(AuthTry {
            user,
            password,
            encrypted,
            accepted,
        });
        io.get_mut().write_all(if accepted {
            b"235 2.7.0 authenticated\r\n"
        } else {
            b"535 5.7.8 authentication failed\r\n"
        })?;
        Ok(accepted)
    }

    /// If the peer is told to hang, wait (answering nothing, keeping the
    /// connection) until it is told to stop; true when it waited, and the
    /// session should then be dropped.
    fn hung(&self) -> bool {
        if !self.script.hang.load(Ordering::SeqCst) {
            return false;
        }
        while self.script.hang.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

/// How a dialogue ended.
enum End {
    Closed,
    StartTls,
}

impl Peer {
    fn session(&self, stream: TcpStream) -> std::io::Result<()> {
        let tls = |config: &Arc<rustls::ServerConfig>, s: TcpStream| {
            rustls::StreamOwned::new(rustls::ServerConnection::new(config.clone()).unwrap(), s)
        };
        match &self.script.tls {
            PeerTls::Implicit(config) => {
                self.dialogue(&mut BufReader::new(tls(config, stream)), true, false, true)?;
            }
            PeerTls::StartTls(config) => {
                let mut io = BufReader::new(stream);
                if let End::StartTls = self.dialogue(&mut io, true, true, false)? {
                    let stream = io.into_inner();
                    self.dialogue(&mut BufReader::new(tls(config, stream)), false, false, true)?;
                }
            }
            PeerTls::None => {
                self.dialogue(&mut BufReader::new(stream), true, false, false)?;
            }
        }
        Ok(())
    }

    fn dialogue<S: std::io::Read + Write>(
        &self,
        io: &mut BufReader<S>,
        greet: bool,
        offer_starttls: bool,
        encrypted: bool,
    ) -> std::io::Result<End> {
        let script = &self.script;
        if greet {
            if self.hung() {
                return Ok(End::Closed);
            }
            io.get_mut().write_all(b"220 scripted ESMTP\r\n")?;
        }
        let mut rcpts: Vec<String> = Vec::new();
        let mut sender = String::new();
        let mut authenticated = false;
        // Which try of its address each accepted recipient is.
        let mut rcpt_tries: Vec<u32> = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            if io.read_line(&mut line)? == 0 {
                return Ok(End::Closed);
            }
            if self.hung() {
                return Ok(End::Closed);
            }
            let upper = line.to_ascii_uppercase();
            let out = io.get_mut();
            if upper.starts_with("EHLO") || upper.starts_with("HELO") {
                if offer_starttls {
                    out.write_all(b"250-scripted\r\n250-STARTTLS\r\n")?;
                }
                if script.auth.is_some() {
                    out.write_all(b"250-AUTH PLAIN LOGIN\r\n")?;
                }
                if script.pipelining {
                    out.write_all(b"250-PIPELINING\r\n")?;
                }
                if script.no_smtputf8 {
                    out.write_all(b"250-scripted\r\n250 8BITMIME\r\n")?;
                } else {
                    out.write_all(b"250-scripted\r\n250-8BITMIME\r\n250 SMTPUTF8\r\n")?;
                }
            } else if script.no_smtputf8
                && (upper.starts_with("MAIL FROM") || upper.starts_with("RCPT TO"))
                && (!line.is_ascii() || upper.contains("SMTPUTF8"))
            {
                self.faults.fetch_add(1, Ordering::SeqCst);
                out.write_all(b"553 5.6.7 non-ASCII address, and no SMTPUTF8 here\r\n")?;
            } else if upper.starts_with("STARTTLS") && offer_starttls {
                out.write_all(b"220 ready to start TLS\r\n")?;
                out.flush()?;
                return Ok(End::StartTls);
            } else if upper.starts_with("AUTH ") && script.auth.is_some() {
                authenticated = self.auth(io, &line.clone(), encrypted)?;
            } else if upper.starts_with("MAIL FROM") && script.auth.is_some() && !authenticated {
                out.write_all(b"530 5.7.0 authentication required\r\n")?;
            } else if upper.starts_with("MAIL FROM") {
                self.mails.fetch_add(1, Ordering::SeqCst);
                // Already here, unanswered: this MAIL's RCPT and DATA.
                let ahead = String::from_utf8_lossy(io.buffer()).to_ascii_uppercase();
                if ahead.starts_with("RCPT TO") && ahead.contains("\r\nDATA\r\n") {
                    self.flights.fetch_add(1, Ordering::SeqCst);
                }
                let out = io.get_mut();
                rcpts.clear();
                rcpt_tries.clear();
                sender = line
                    .split(['<', '>'])
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                out.write_all(b"250 ok\r\n")?;
            } else if upper.starts_with("RCPT TO") {
                let addr = line
                    .split(['<', '>'])
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                let n = {
                    let mut t = self.tries.lock().unwrap();
                    let n = t.entry(addr.clone()).or_insert(0);
                    *n += 1;
                    *n
                };
                let rejection = match &script.reject_reply {
                    Some(reply) => format!("{}\r\n", reply.trim_end()),
                    None => "550 5.1.1 no such user here\r\n".to_string(),
                };
                if picked(&addr, REJECT, script.reject_every) {
                    self.faults.fetch_add(1, Ordering::SeqCst);
                    out.write_all(rejection.as_bytes())?;
                } else if n == 1 && picked(&addr, SLOW_DOWN, script.slow_down_every) {
                    self.faults.fetch_add(1, Ordering::SeqCst);
                    out.write_all(b"421 4.7.0 slow down\r\n")?;
                    out.flush()?;
                    return Ok(End::Closed);
                } else if n == 1 && picked(&addr, TEMPFAIL, script.tempfail_every) {
                    self.faults.fetch_add(1, Ordering::SeqCst);
                    out.write_all(b"451 4.3.0 try again later\r\n")?;
                } else {
                    let scripted = script
                        .rcpt_replies
                        .iter()
                        .find(|(pat, _)| addr.contains(pat.as_str()));
                    match (&script.reject, &script.tempfail) {
                        _ if scripted.is_some() => {
                            let reply = scripted.map(|(_, r)| r.trim_end()).unwrap_or_default();
                            out.write_all(format!("{reply}\r\n").as_bytes())?
                        }
                        (Some(pat), _) if addr.contains(pat.as_str()) => {
                            out.write_all(rejection.as_bytes())?
                        }
                        (_, Some((pat, times))) if addr.contains(pat.as_str()) && n <= *times => {
                            out.write_all(b"451 4.3.0 try again later\r\n")?
                        }
                        _ => {
                            rcpts.push(addr);
                            rcpt_tries.push(n);
                            out.write_all(b"250 ok\r\n")?
                        }
                    }
                }
            } else if upper.starts_with("DATA") && rcpts.is_empty() {
                // As RFC 2920 asks (and Postfix does).
                out.write_all(b"554 5.5.1 no valid recipients\r\n")?;
            } else if upper.starts_with("DATA") {
                out.write_all(b"354 go ahead\r\n")?;
                out.flush()?;
                let mut text = String::new();
                loop {
                    line.clear();
                    if io.read_line(&mut line)? == 0 {
                        return Ok(End::Closed);
                    }
                    if line == ".\r\n" {
                        break;
                    }
                    if script.keep_data {
                        text.push_str(&line);
                    }
                }
                std::thread::sleep(script.data_delay);
                if self.hung() {
                    return Ok(End::Closed);
                }
                let first_try = |salt: &str, every: Option<u32>| {
                    rcpts
                        .iter()
                        .zip(&rcpt_tries)
                        .any(|(a, &n)| n == 1 && picked(a, salt, every))
                };
                if first_try(DISCONNECT_IN_DATA, script.disconnect_in_data_every) {
                    self.faults.fetch_add(1, Ordering::SeqCst);
                    return Ok(End::Closed);
                }
                let unanswered =
                    first_try(ACCEPT_THEN_DISCONNECT, script.accept_then_disconnect_every)
                        .then(|| rcpts.clone());
                rcpt_tries.clear();
                if script.keep_data {
                    self.messages.lock().unwrap().push((rcpts.clone(), text));
                }
                {
                    let mut senders = self.senders.lock().unwrap();
                    for a in &rcpts {
                        senders.insert(a.clone(), sender.clone());
                    }
                }
                let mut r = self.received.lock().unwrap();
                let now = Instant::now();
                self.log
                    .lock()
                    .unwrap()
                    .extend(rcpts.iter().map(|a| (now, a.clone())));
                for a in rcpts.drain(..) {
                    *r.entry(a).or_insert(0) += 1;
                    if encrypted {
                        self.encrypted.fetch_add(1, Ordering::SeqCst);
                    }
                }
                drop(r);
                if let Some(addrs) = unanswered {
                    self.faults.fetch_add(1, Ordering::SeqCst);
                    let mut u = self.unanswered.lock().unwrap();
                    for a in addrs {
                        *u.entry(a).or_insert(0) += 1;
                    }
                    return Ok(End::Closed);
                }
                self.delivered.set(self.delivered.get() + 1);
                io.get_mut().write_all(b"250 queued\r\n")?;
            } else if upper.starts_with("RSET") {
                self.resets.fetch_add(1, Ordering::SeqCst);
                rcpts.clear();
                rcpt_tries.clear();
                out.write_all(b"250 ok\r\n")?;
            } else if upper.starts_with("NOOP") {
                out.write_all(b"250 ok\r\n")?;
            } else if upper.starts_with("QUIT") {
                self.quit.set(true);
                self.leave();
                out.write_all(b"221 bye\r\n")?;
                out.flush()?;
                return Ok(End::Closed);
            } else {
                out.write_all(b"502 unknown\r\n")?;
            }
            io.get_mut().flush()?;
        }
    }
}

/// Base URL of the PostgreSQL server the tests create databases on.
pub fn pg_base() -> String {
    std::env::var("MAILSPLIT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432".into())
}

static DB_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh, empty database, dropped with the value.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

impl TestDb {
    pub fn new(kind: Kind) -> TestDb {
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                TestDb {
                    url: format!("sqlite://{}", dir.path().join("test.db").display()),
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
            Kind::Postgres => {
                let name = format!(
                    "mailsplit_t{}_{}_{}",
                    std::process::id(),
                    DB_SEQ.fetch_add(1, Ordering::SeqCst),
                    Instant::now().elapsed().subsec_nanos()
                );
                psql(&format!("CREATE DATABASE {name}"));
                TestDb {
                    url: format!("{}/{name}", pg_base()),
                    pg_name: Some(name),
                    _dir: None,
                }
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            psql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

fn psql(sql: &str) {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let mut c = diesel::PgConnection::establish(&format!("{}/test", pg_base()))
        .expect("PostgreSQL is not reachable; set MAILSPLIT_TEST_PG");
    c.batch_execute(sql).unwrap();
}

/// Everything one test's commands share.
pub struct Env {
    pub db: TestDb,
    pub beanstalkd: String,
    pub tube: String,
    pub smtp: String,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new(kind: Kind, beanstalkd: &str) -> Env {
        Env {
            db: TestDb::new(kind),
            beanstalkd: beanstalkd.to_string(),
            tube: format!("t{}", free_port()),
            smtp: "smtp://127.0.0.1:1".into(),
            dir: tempfile::tempdir().unwrap(),
        }
    }
    /// The binary with this environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(self.dir.path())
            .env("DATABASE_URL", &self.db.url)
            .env("BEANSTALKD", &self.beanstalkd)
            .env("MAILSPLIT_TUBE", &self.tube)
            .env("SMTP_URL", &self.smtp)
            .env("MAILSPLIT_LOG", "info")
            // A default from the caller's environment would change what
            // `campaign create` does; tests set it where they mean it.
            .env_remove("MAILSPLIT_PUBLIC_URL");
        c
    }
    /// Run to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
    /// Run and insist on exit 0; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "mailsplit {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// Write a CSV of `n` recipients `user{i}@example.test` and import it.
    pub fn import_n(&self, list: &str, n: usize) {
        let path = self.dir.path().join(format!("{list}.csv"));
        write_csv(&path, n);
        self.ok(&["migrate"]);
        self.ok(&["import", path.to_str().unwrap(), "--list", list]);
    }
    /// Migrate, import `n` recipients, create and enqueue campaign `name`.
    pub fn campaign(&self, name: &str, n: usize) {
        self.campaign_without_enqueue(name, n);
        self.ok(&["enqueue", name]);
    }
    /// Migrate, import `n` recipients into list `name`, create campaign
    /// `name` for it.
    pub fn campaign_without_enqueue(&self, name: &str, n: usize) {
        self.import_n(name, n);
        self.create_campaign(name, name, &[]);
    }
    /// `status --json` of one campaign.
    pub fn status(&self, name: &str) -> serde_json::Value {
        let out = self.ok(&["status", name, "--json"]);
        serde_json::from_str(out.trim()).unwrap()
    }
    /// `workers --json`: one object per heartbeat row.
    pub fn workers(&self) -> Vec<serde_json::Value> {
        self.ok(&["workers", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
    /// Start a worker in the background.
    pub fn worker(&self, extra: &[&str]) -> Proc {
        let mut args = vec!["worker", "--smtp", &self.smtp];
        args.extend_from_slice(extra);
        Proc(
            self.cmd(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }
    /// Run SQL against the test database.
    pub fn sql(&self, sql: &str) {
        let mut c = mailsplit::store::Conn::open(&self.db.url).unwrap();
        c.execute_batch(sql).unwrap();
    }
    pub fn conn(&self) -> mailsplit::store::Conn {
        mailsplit::store::Conn::open(&self.db.url).unwrap()
    }
    /// This database's identity (after `migrate`).
    pub fn identity(&self) -> mailsplit::tokens::Identity {
        let installed = mailsplit::store::installation::load(&mut self.conn()).unwrap();
        mailsplit::tokens::Identity::from(&installed)
    }
    /// A job body exactly as `enqueue` would put it: signed for this
    /// database.
    pub fn signed_job(&self, campaign: i64, recipients: &[i64]) -> Vec<u8> {
        mailsplit::queue::JobBody::new(campaign, recipients.to_vec()).encode(&self.identity())
    }
    /// `campaign create NAME --list LIST --template newsletter --subject
    /// Hello --from news@example.test`, plus `extra` options.
    pub fn try_create_campaign(&self, name: &str, list: &str, extra: &[&str]) -> Output {
        self.try_create_campaign_from(name, list, "news@example.test", extra)
    }
    /// Like [`Env::try_create_campaign`], with another `--from`.
    pub fn try_create_campaign_from(
        &self,
        name: &str,
        list: &str,
        from: &str,
        extra: &[&str],
    ) -> Output {
        let mut args = vec![
            "campaign",
            "create",
            name,
            "--list",
            list,
            "--template",
            "newsletter",
            "--subject",
            "Hello",
            "--from",
            from,
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }
    /// Like [`Env::try_create_campaign`], insisting on success; returns stdout.
    pub fn create_campaign(&self, name: &str, list: &str, extra: &[&str]) -> String {
        let out = self.try_create_campaign(name, list, extra);
        assert!(
            out.status.success(),
            "campaign create {name} failed: {}{}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }
}

/// A beanstalkd, a scripted peer and an environment pointing at both.
pub fn setup(kind: Kind, script: Script) -> (tempfile::TempDir, Beanstalkd, ScriptedSmtp, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let peer = ScriptedSmtp::start(script);
    let mut env = Env::new(kind, &bs.addr());
    env.smtp = peer.url();
    (tmp, bs, peer, env)
}

/// A peer slow enough (20 ms per message) that a campaign takes seconds.
pub fn slow() -> Script {
    Script {
        data_delay: Duration::from_millis(20),
        ..Script::default()
    }
}

/// Recipient ids of a list, in id order.
pub fn member_ids(env: &Env, list: &str) -> Vec<i64> {
    use mailsplit::store::recipients;
    let mut conn = env.conn();
    let list_id = recipients::find_list(&mut conn, list).unwrap();
    recipients::member_page(&mut conn, list_id, 0, i64::MAX)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

pub fn write_csv(path: &Path, n: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "email,name,city").unwrap();
    for i in 1..=n {
        writeln!(f, "user{i}@example.test,User {i},City {}", i % 7).unwrap();
    }
}

/// The values of a header of a message (its top-level header section),
/// unfolded.
pub fn header(message: &str, name: &str) -> Vec<String> {
    let head = &message[..message.find("\r\n\r\n").unwrap_or(message.len())];
    head.replace("\r\n ", " ")
        .replace("\r\n\t", " ")
        .split("\r\n")
        .filter(|l| {
            l.len() > name.len()
                && l[..name.len()].eq_ignore_ascii_case(name)
                && l.as_bytes()[name.len()] == b':'
        })
        .map(|l| l[name.len() + 1..].trim().to_string())
        .collect()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Send a signal to a child.
pub fn signal(child: &Child, sig: &str) {
    Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
}

/// Wait for a child to exit, up to `secs`; returns its status.
pub fn wait_exit(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not exit within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The shared bounce and complaint fixtures (`MANIFEST.tsv` and 43 real
/// messages): `MAILSPLIT_BOUNCE_FIXTURES`, else `../shared/fixtures/bounces`
/// beside the repository, else `/work/shared/fixtures/bounces`.
pub fn bounce_fixtures() -> PathBuf {
    let candidates = [
        std::env::var("MAILSPLIT_BOUNCE_FIXTURES")
            .ok()
            .map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/bounces")),
        Some(PathBuf::from("/work/shared/fixtures/bounces")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.join("MANIFEST.tsv").is_file())
        .expect("bounce fixtures not found: set MAILSPLIT_BOUNCE_FIXTURES to the folder with MANIFEST.tsv")
}

/// A delivery status notification as Postfix writes it: to `envelope_to`
/// (the VERP address), reporting `final_rcpt` with `status`.
pub fn postfix_dsn(
    envelope_to: &str,
    final_rcpt: &str,
    status: &str,
    diagnostic: &str,
    message_id: &str,
) -> String {
    let action = if status.starts_with('4') && diagnostic.contains("delayed") {
        "delayed"
    } else {
        "failed"
    };
    format!(
        "Return-Path: <MAILER-DAEMON>\r\n\
Date: Mon, 23 Nov 2026 12:37:38 +0000 (UTC)\r\n\
From: Mail Delivery System <MAILER-DAEMON@mta.mailsplit.test>\r\n\
Subject: Undelivered Mail Returned to Sender\r\n\
To: {envelope_to}\r\n\
Auto-Submitted: auto-replied\r\n\
MIME-Version: 1.0\r\n\
Content-Type: multipart/report; report-type=delivery-status;\r\n\
\tboundary=\"B1/mta.mailsplit.test\"\r\n\
Message-Id: <{unique}@mta.mailsplit.test>\r\n\
\r\n\
This is a MIME-encapsulated message.\r\n\
\r\n\
--B1/mta.mailsplit.test\r\n\
Content-Description: Notification\r\n\
Content-Type: text/plain; charset=us-ascii\r\n\
\r\n\
<{final_rcpt}>: host 127.0.0.1 said: {diagnostic}\r\n\
\r\n\
--B1/mta.mailsplit.test\r\n\
Content-Description: Delivery report\r\n\
Content-Type: message/delivery-status\r\n\
\r\n\
Reporting-MTA: dns; mta.mailsplit.test\r\n\
X-Postfix-Sender: rfc822; {envelope_to}\r\n\
\r\n\
Final-Recipient: rfc822; {final_rcpt}\r\n\
Original-Recipient: rfc822;{final_rcpt}\r\n\
Action: {action}\r\n\
Status: {status}\r\n\
Diagnostic-Code: smtp; {diagnostic}\r\n\
\r\n\
--B1/mta.mailsplit.test\r\n\
Content-Description: Undelivered Message Headers\r\n\
Content-Type: text/rfc822-headers\r\n\
\r\n\
Return-Path: <{envelope_to}>\r\n\
From: news@example.test\r\n\
To: {final_rcpt}\r\n\
Subject: Hello\r\n\
Message-ID: {message_id}\r\n\
\r\n\
--B1/mta.mailsplit.test--\r\n",
        unique = free_port(),
    )
}

pub mod postfix;

/// A TCP forwarder to `target` on a port of its own, to take a server
/// (PostgreSQL) away and bring it back without touching the server:
/// `stop` refuses new connections and cuts the open ones, `start` listens
/// again on the same port.
pub struct TcpProxy {
    pub port: u16,
    target: std::net::SocketAddr,
    running: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpProxy {
    pub fn start(target: std::net::SocketAddr) -> TcpProxy {
        let mut p = TcpProxy {
            port: free_port(),
            target,
            running: Arc::new(AtomicBool::new(false)),
            conns: Default::default(),
            thread: None,
        };
        p.resume();
        p
    }

    /// Listen (again).
    pub fn resume(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        self.running.store(true, Ordering::SeqCst);
        let (running, conns, target) = (self.running.clone(), self.conns.clone(), self.target);
        self.thread = Some(std::thread::spawn(move || {
            while running.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let mut list = conns.lock().unwrap();
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
                list.push(client);
                list.push(server);
            }
        }));
    }

    /// Refuse connections and cut the open ones.
    pub fn stop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run `cmd` to completion like `Command::output`, but kill it and fail
/// the test if it is still running after `secs` (a command that should
/// refuse at once must not hang a test when it does not).
pub fn output_within(cmd: &mut Command, secs: u64) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still running after {secs} s; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// Stop a worker started by [`Env::worker`] with SIGTERM, insist on a
/// clean exit, and return what it logged.
pub fn stop_worker(mut w: Proc) -> String {
    signal(&w.0, "TERM");
    assert!(wait_exit(&mut w.0, 30).success(), "worker did not exit 0");
    let mut log = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    log
}

/// A beanstalkd (with a binlog in a fresh directory) and an environment
/// on it with a fresh database of `kind`.
pub fn env_with_beanstalkd(kind: Kind) -> (tempfile::TempDir, Beanstalkd, Env) {
    let tmp = tempfile::tempdir().unwrap();
    let bs = Beanstalkd::start(tmp.path());
    let env = Env::new(kind, &bs.addr());
    (tmp, bs, env)
}

/// A running `mailsplit serve` (public and admin listeners), killed when
/// dropped.
pub struct Served {
    pub proc: Proc,
    pub public: u16,
    pub admin: u16,
}

impl Env {
    /// `mailsplit serve` on free ports, with `token` as
    /// MAILSPLIT_ADMIN_TOKEN (none: loopback-only, open).
    pub fn serve(&self, token: Option<&str>) -> Served {
        let (public, admin) = (free_port(), free_port());
        let mut cmd = self.cmd(&[
            "serve",
            "--listen",
            &format!("127.0.0.1:{public}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ]);
        cmd.env_remove("MAILSPLIT_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(t) = token {
            cmd.env("MAILSPLIT_ADMIN_TOKEN", t);
        }
        let proc = Proc(cmd.spawn().unwrap());
        wait_port(public);
        wait_port(admin);
        Served {
            proc,
            public,
            admin,
        }
    }
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Http {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Http {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request to `127.0.0.1:port` (redirects are not followed; a body is
/// sent as a form unless a Content-Type header says otherwise).
pub fn http(
    method: &str,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Http {
    let agent = ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(Duration::from_secs(20))
        .build();
    let mut req = agent.request(method, &format!("http://127.0.0.1:{port}{path}"));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let sent = match body {
        Some(b)
            if headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type")) =>
        {
            req.send_string(b)
        }
        Some(b) => req
            .set("Content-Type", "application/x-www-form-urlencoded")
            .send_string(b),
        None => req.call(),
    };
    let resp = match sent {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = resp.status();
    let headers = resp
        .headers_names()
        .into_iter()
        .flat_map(|name| {
            resp.all(&name)
                .into_iter()
                .map(|v| (name.clone(), v.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    Http {
        status,
        headers,
        body: resp.into_string().unwrap_or_default(),
    }
}

/// Taken by every test of a binary whose assertions are rates measured at a
/// peer (ratelimit, connections): they run one at a time, so the binary's
/// other test thread never takes half the CPU whose throughput they measure.
pub fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a run resolved the previous run's in-doubt window (from its log):
/// how many of its recipients were found and how many put again.
pub fn in_doubt_outcome(log: &str) -> String {
    let Some(line) = log.lines().find(|l| l.contains("interrupted run resolved")) else {
        return "none".into();
    };
    let field = |name: &str| {
        line.split_once(&format!("{name}="))
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    format!(
        "{} found in the queue, {} in the ledger, {} put again",
        field("found_in_queue"),
        field("found_in_ledger"),
        field("put_again")
    )
}
