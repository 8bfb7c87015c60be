//! `mailsplit bounce`: what comes back after a send. One message at a time
//! (from Postfix's pipe(8) transport on stdin, or each file of a Maildir)
//! is read by [`report`] into findings; [`trust`] finds the one recipient
//! it is about by a token only we could have written (the VERP token, or
//! the signed Message-ID of a message the ledger sent), and one event is
//! recorded with its action (see [`action_for`]): a hard bounce makes the
//! recipient `bounced`, soft bounces do after `--soft-limit` of them within
//! `--soft-window-days`, a complaint unsubscribes. A report without such a
//! token changes nobody and is recorded as unverified; what is no report
//! (auto-replies, ordinary mail) is logged and ignored. Recording is
//! idempotent per message, so a report that Postfix delivers again after a
//! temporary failure is counted once.
//!
//! Read in this order: [`report`] (parse), [`classify`] (codes and words
//! into kinds), [`trust`] (whom it may change), then [`handle`] here.

pub mod classify;
pub mod message;
pub mod report;
pub mod trust;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::store::bounces::{self, Action, BounceKind, BounceSource, NewBounce};
use crate::store::unverified::{self, NewUnverified};
use crate::store::{Conn, RecipientStatus, StoreError};
use crate::tokens::Identity;
use report::ParsedReport as Report;

/// Soft bounces that make a recipient `bounced`…
pub const DEFAULT_SOFT_LIMIT: u32 = 3;
/// …within this many days.
pub const DEFAULT_SOFT_WINDOW_DAYS: u32 = 14;
/// The most of one message that is read: reports come first, and what a
/// returned message drags behind is not needed.
pub const MAX_MESSAGE_BYTES: u64 = 16 << 20;

/// How soft bounces add up.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub soft_limit: u32,
    pub soft_window: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            soft_limit: DEFAULT_SOFT_LIMIT,
            soft_window: Duration::from_secs(u64::from(DEFAULT_SOFT_WINDOW_DAYS) * 86_400),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BounceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// One event recorded for one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub recipient_id: i64,
    pub email: String,
    pub campaign_id: Option<i64>,
    pub kind: BounceKind,
    pub status: Option<String>,
    /// False when this message had been recorded before.
    pub new: bool,
    /// The recipient's new status, if this event changed it.
    pub changed_to: Option<RecipientStatus>,
}

/// A report nobody can vouch for (see [`trust`]): recorded in
/// `unverified_reports`, and it changed nobody.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unverified {
    pub format: &'static str,
    /// How many addresses it named.
    pub addresses: usize,
    /// The first few of them.
    pub sample: Vec<String>,
    pub why: String,
}

/// Addresses of an unverified report that are shown (the rest counted).
const SAMPLE: usize = 3;

impl std::fmt::Display for Unverified {
    /// One short line however many addresses the report named.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let more = self.addresses.saturating_sub(self.sample.len());
        let named = match (self.sample.is_empty(), more) {
            (true, _) => String::new(),
            (false, 0) => format!(" ({})", self.sample.join(", ")),
            (false, more) => format!(" ({}, … and {more} more)", self.sample.join(", ")),
        };
        write!(
            f,
            "unverified {} report naming {} address{}{named}: {}; changed nobody",
            self.format,
            self.addresses,
            if self.addresses == 1 { "" } else { "es" },
            self.why
        )
    }
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Believed: the event of the one recipient its token names.
    Recorded(Vec<Applied>),
    /// Believed: about the transactional message its token names.
    Message(message::MessageApplied),
    /// A report, but nothing in it is ours: recorded as unverified.
    Unverified(Unverified),
    /// Not a report, or a report that names nobody: why.
    Ignored(String),
}

/// The identity VERP tokens are checked under: this database's own.
pub fn identity(conn: &mut Conn) -> Result<Identity, StoreError> {
    Ok(Identity::from(&crate::store::installation::load(conn)?))
}

/// Handle one message. `envelope` is the address Postfix delivered it to
/// (pipe(8)'s `${recipient}`), when given. Fails only when the database
/// does: the caller then asks for the message again later.
pub fn handle(
    conn: &mut Conn,
    identity: &Identity,
    raw: &[u8],
    envelope: Option<&str>,
    settings: &Settings,
) -> Result<Handled, StoreError> {
    let report = report::parse(raw);
    if !report.is_report() {
        return Ok(Handled::Ignored("not a bounce or complaint report".into()));
    }
    if report.findings.is_empty() {
        return Ok(Handled::Ignored(format!(
            "{} report names no recipient",
            report.format
        )));
    }
    let fingerprint = fingerprint(raw);
    if let Some(id) = trust::message_of(identity, &report, envelope) {
        return Ok(
            match message::record(conn, id, &report, &fingerprint, settings)? {
                Some(applied) => Handled::Message(applied),
                None => {
                    let why = format!("its VERP token names message {id}, which is not on file");
                    record_unverified(conn, &report, &fingerprint, why)?
                }
            },
        );
    }
    let target = match trust::resolve(conn, identity, &report, envelope)? {
        Ok(target) => target,
        Err(why) => return record_unverified(conn, &report, &fingerprint, why),
    };
    record_for(conn, target, &report, &fingerprint, settings)
}

/// Record the report's finding for the recipient the report was traced
/// to, with the action its kind and the settings call for.
fn record_for(
    conn: &mut Conn,
    target: trust::Target,
    report: &Report,
    fingerprint: &str,
    settings: &Settings,
) -> Result<Handled, StoreError> {
    let f = &target.finding;
    let action = finding_action(f, report, settings);
    let done = bounces::record(
        conn,
        &NewBounce {
            recipient_id: target.recipient_id,
            campaign_id: target.campaign_id,
            email: f.address.as_deref().unwrap_or(&target.email),
            kind: f.kind,
            status: f.status.as_deref(),
            reason: &f.reason,
            source: BounceSource::Report,
            fingerprint,
        },
        &action,
    )?;
    Ok(Handled::Recorded(vec![Applied {
        recipient_id: target.recipient_id,
        email: target.email,
        campaign_id: target.campaign_id,
        kind: f.kind,
        status: f.status.clone(),
        new: done.new,
        changed_to: done.changed_to,
    }]))
}

/// Record a report that changes nobody, once per message.
fn record_unverified(
    conn: &mut Conn,
    report: &Report,
    fingerprint: &str,
    why: String,
) -> Result<Handled, StoreError> {
    let named: Vec<&str> = report
        .findings
        .iter()
        .filter_map(|f| f.address.as_deref())
        .collect();
    let sample: Vec<String> = named.iter().take(SAMPLE).map(|a| a.to_string()).collect();
    let kind = report
        .findings
        .iter()
        .map(|f| f.kind)
        .max_by_key(|&k| trust::severity(k));
    unverified::record(
        conn,
        &NewUnverified {
            fingerprint,
            format: report.format,
            kind: kind.map(|k| k.as_str()),
            addresses: named.len() as i64,
            sample: &sample.join(", "),
            why: &why,
        },
    )?;
    Ok(Handled::Unverified(Unverified {
        format: report.format,
        addresses: named.len(),
        sample,
        why,
    }))
}

/// [`action_for`] a report's finding.
fn finding_action(f: &report::Finding, report: &Report, settings: &Settings) -> Action {
    action_for(
        f.kind,
        f.status.as_deref(),
        &f.reason,
        report.format,
        settings,
    )
}

/// What an event of this kind does to its recipient.
pub fn action_for(
    kind: BounceKind,
    status: Option<&str>,
    reason: &str,
    source: &str,
    settings: &Settings,
) -> Action {
    let code = status.map(|s| format!("{s} ")).unwrap_or_default();
    match kind {
        BounceKind::Hard => Action::Bounce(format!("hard bounce ({source}): {code}{reason}")),
        BounceKind::Soft => Action::CountSoft {
            limit: i64::from(settings.soft_limit),
            window_ms: settings.soft_window.as_millis() as i64,
            reason: format!(
                "{} soft bounces within {} days ({source}); last: {code}{reason}",
                settings.soft_limit,
                settings.soft_window.as_secs() / 86_400
            ),
        },
        BounceKind::Complaint => Action::Unsubscribe(format!(
            "complaint: {} ({source})",
            status.unwrap_or("abuse")
        )),
        BounceKind::Feedback if matches!(status, Some("opt-out" | "unsubscribe")) => {
            Action::Unsubscribe(format!("opt-out report ({source})"))
        }
        BounceKind::Feedback | BounceKind::Policy | BounceKind::Delayed => Action::Record,
    }
}

pub use trust::read_verp;

/// Names a message: the same bytes, delivered again, are the same report.
pub fn fingerprint(raw: &[u8]) -> String {
    let digest = Sha256::digest(raw);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Read one message from `input`, at most [`MAX_MESSAGE_BYTES`] of it; the
/// rest is read and dropped, so the writer (Postfix) never sees a broken
/// pipe.
pub fn read_message(mut input: impl Read) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    (&mut input).take(MAX_MESSAGE_BYTES).read_to_end(&mut raw)?;
    std::io::copy(&mut input, &mut std::io::sink())?;
    Ok(raw)
}

/// What a Maildir run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MaildirSummary {
    pub recorded: usize,
    pub unverified: usize,
    pub ignored: usize,
}

/// Handle every message in `dir/new`, oldest name first, moving each one
/// handled or ignored to `dir/cur` (marked seen). Stops at the first
/// database error, leaving that message and the rest in `new/` for the
/// next run.
pub fn maildir(
    conn: &mut Conn,
    identity: &Identity,
    dir: &Path,
    settings: &Settings,
    mut log: impl FnMut(&Path, &Handled),
) -> Result<MaildirSummary, BounceError> {
    let new = dir.join("new");
    let cur = dir.join("cur");
    let read_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| BounceError::Read { path, source }
    };
    std::fs::create_dir_all(&cur).map_err(read_err(&cur))?;
    let mut names: Vec<PathBuf> = std::fs::read_dir(&new)
        .map_err(read_err(&new))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    names.sort();
    let mut summary = MaildirSummary::default();
    for path in names {
        let raw = match std::fs::File::open(&path).and_then(read_message) {
            Ok(raw) => raw,
            // Taken by another run meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(read_err(&path)(e)),
        };
        let handled = handle(conn, identity, &raw, None, settings)?;
        log(&path, &handled);
        match handled {
            Handled::Recorded(_) | Handled::Message(_) => summary.recorded += 1,
            Handled::Unverified(_) => summary.unverified += 1,
            Handled::Ignored(_) => summary.ignored += 1,
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let seen = match name.split_once(":2,") {
            Some((base, flags)) if !flags.contains('S') => format!("{base}:2,{flags}S"),
            Some(_) => name,
            None => format!("{name}:2,S"),
        };
        match std::fs::rename(&path, cur.join(seen)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(read_err(&path)(e)),
        }
    }
    Ok(summary)
}
