//! One session of the scripted SMTP peer.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::quota;
use super::*;

pub(super) struct Peer {
    pub(super) script: Script,
    pub(super) received: Arc<Mutex<HashMap<String, u32>>>,
    pub(super) tries: Arc<Mutex<HashMap<String, u32>>>,
    pub(super) encrypted: Arc<AtomicUsize>,
    pub(super) log: Arc<Mutex<Vec<(Instant, String)>>>,
    pub(super) unanswered: Arc<Mutex<HashMap<String, u32>>>,
    pub(super) unheard: Arc<Mutex<HashMap<String, u32>>>,
    pub(super) faults: Arc<AtomicUsize>,
    pub(super) messages: Arc<Mutex<Vec<Accepted>>>,
    pub(super) senders: Arc<Mutex<HashMap<String, String>>>,
    pub(super) auths: Arc<Mutex<Vec<AuthTry>>>,
    pub(super) gate: Arc<Gate>,
    /// This session no longer counts in `gate`.
    pub(super) left: std::cell::Cell<bool>,
    pub(super) delivered: std::cell::Cell<u32>,
    pub(super) quit: std::cell::Cell<bool>,
    pub(super) mails: Arc<AtomicUsize>,
    pub(super) flights: Arc<AtomicUsize>,
    pub(super) resets: Arc<AtomicUsize>,
}

impl Peer {
    /// The session ends: it no longer counts against `max_greeted` (at
    /// QUIT, before the reply, so the client's next session never sees it).
    pub(super) fn leave(&self) {
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
    pub(super) fn auth<S: std::io::Read + Write>(
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

    /// The client closed the session (or it broke) right after the peer
    /// answered these recipients' message: it may not have read the 250.
    fn unheard(&self, rcpts: &[String]) {
        tally(&self.unheard, rcpts.iter().cloned());
    }

    /// If the peer is told to hang, wait (answering nothing, keeping the
    /// connection) until it is told to stop; true when it waited, and the
    /// session should then be dropped.
    pub(super) fn hung(&self) -> bool {
        if !self.script.hang.load(Ordering::SeqCst) {
            return false;
        }
        while self.script.hang.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

/// One more for each address in a per-address count.
fn tally(counts: &Mutex<HashMap<String, u32>>, addrs: impl IntoIterator<Item = String>) {
    let mut c = counts.lock().unwrap();
    for a in addrs {
        *c.entry(a).or_insert(0) += 1;
    }
}

/// How a dialogue ended.
enum End {
    Closed,
    StartTls,
}

impl Peer {
    pub(super) fn session(&self, stream: TcpStream) -> std::io::Result<()> {
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
        // A MAIL was accepted and its transaction is not over.
        let mut mail_open = false;
        // Which try of its address each accepted recipient is.
        let mut rcpt_tries: Vec<u32> = Vec::new();
        let mut line = String::new();
        // The recipients of the message just answered with 250, until the
        // client's next command shows it read the reply.
        let mut answered: Vec<String> = Vec::new();
        loop {
            line.clear();
            let read = io.read_line(&mut line);
            if !matches!(read, Ok(n) if n > 0) {
                self.unheard(&answered);
                return read.map(|_| End::Closed);
            }
            answered.clear();
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
                if script.mail_quota.as_ref().is_some_and(|q| !q.admit()) {
                    mail_open = false;
                    out.write_all(quota::THROTTLE_REPLY)?;
                    out.flush()?;
                    continue;
                }
                mail_open = true;
                sender = line
                    .split(['<', '>'])
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                out.write_all(b"250 ok\r\n")?;
            } else if script.mail_quota.is_some()
                && !mail_open
                && (upper.starts_with("RCPT TO") || upper.starts_with("DATA"))
            {
                out.write_all(quota::NEED_MAIL_REPLY)?;
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
                answered.clone_from(&rcpts);
                for a in rcpts.drain(..) {
                    *r.entry(a).or_insert(0) += 1;
                    if encrypted {
                        self.encrypted.fetch_add(1, Ordering::SeqCst);
                    }
                }
                drop(r);
                if let Some(addrs) = unanswered {
                    self.faults.fetch_add(1, Ordering::SeqCst);
                    tally(&self.unanswered, addrs);
                    return Ok(End::Closed);
                }
                mail_open = false;
                self.delivered.set(self.delivered.get() + 1);
                if let Err(e) = io.get_mut().write_all(b"250 queued\r\n") {
                    self.unheard(&answered);
                    return Err(e);
                }
            } else if upper.starts_with("RSET") {
                self.resets.fetch_add(1, Ordering::SeqCst);
                mail_open = false;
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
