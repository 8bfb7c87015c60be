//! SMTP peers: Postfix's smtp-sink, and a scripted peer of our own that
//! records what it accepts and injects faults.

mod peer;
mod quota;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use peer::Peer;
pub use quota::MailQuota;

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
    /// A sending quota at MAIL (see [`MailQuota`]).
    pub mail_quota: Option<Arc<MailQuota>>,
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
    /// Recipients of a message the peer accepted and answered (250) as the
    /// last thing in a session the client then closed without another
    /// command: a client that gave up waiting for the reply (its timeout)
    /// drops the session this way, and cannot know the message went, so a
    /// second copy is legitimate. Per address.
    pub unheard: Arc<Mutex<HashMap<String, u32>>>,
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
            unheard: Default::default(),
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
        let unheard = peer.unheard.clone();
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
                    unheard: unheard.clone(),
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
