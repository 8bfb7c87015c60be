//! `mailsplit bounce`: what comes back after a send. One message at a time
//! (from Postfix's pipe(8) transport on stdin, or each file of a Maildir)
//! is read by [`report`] into findings, its recipient is found — by the
//! VERP token of the address it was sent to (unforgeable: an HMAC under the
//! database's secret), else by the address the report names and the
//! returned message's own Message-ID — and one event per recipient is
//! recorded with its action (see [`action_for`]): a hard bounce makes the
//! recipient `bounced`, soft bounces do after `--soft-limit` of them within
//! `--soft-window-days`, a complaint unsubscribes. What is no report
//! (auto-replies, ordinary mail) or names nobody we know is logged and
//! ignored. Recording is idempotent per message, so a report that Postfix
//! delivers again after a temporary failure is counted once.
//!
//! Read in this order: [`report`] (parse), [`classify`] (codes and words
//! into kinds), then [`handle`] here.

pub mod classify;
pub mod report;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::compose;
use crate::store::bounces::{self, Action, BounceKind, BounceSource, NewBounce};
use crate::store::{campaigns, Conn, RecipientStatus, StoreError};
use crate::tokens::Identity;
use report::{Finding, ParsedReport};

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

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Recorded(Vec<Applied>),
    /// Not a report, or nobody it names is ours: why.
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
    let targets = resolve(conn, identity, &report, envelope)?;
    if targets.is_empty() {
        return Ok(Handled::Ignored(format!(
            "{} report about {} : not a recipient of ours",
            report.format,
            report
                .findings
                .iter()
                .filter_map(|f| f.address.as_deref())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut applied = Vec::new();
    for target in targets {
        let f = &target.finding;
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
                fingerprint: &fingerprint,
            },
            &action_for(
                f.kind,
                f.status.as_deref(),
                &f.reason,
                report.format,
                settings,
            ),
        )?;
        applied.push(Applied {
            recipient_id: target.recipient_id,
            email: target.email,
            campaign_id: target.campaign_id,
            kind: f.kind,
            status: f.status.clone(),
            new: done.new,
            changed_to: done.changed_to,
        });
    }
    Ok(Handled::Recorded(applied))
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

/// A finding matched to one of our recipients.
struct Target {
    recipient_id: i64,
    email: String,
    campaign_id: Option<i64>,
    finding: Finding,
}

/// Which of our recipients a report is about.
fn resolve(
    conn: &mut Conn,
    identity: &Identity,
    report: &ParsedReport,
    envelope: Option<&str>,
) -> Result<Vec<Target>, StoreError> {
    // 1. The VERP token of the address the report was sent to, or of the
    //    reported message's envelope sender: names campaign and recipient.
    let verp = envelope
        .into_iter()
        .map(str::to_string)
        .chain(report.verp_candidates.iter().cloned())
        .find_map(|a| read_verp(identity, &a));
    if let Some((campaign_id, recipient_id)) = verp {
        if let Some(email) = email_of(conn, recipient_id)? {
            let finding = report
                .findings
                .iter()
                .find(|f| {
                    f.address
                        .as_deref()
                        .is_some_and(|a| a.eq_ignore_ascii_case(&email))
                })
                .or_else(|| report.findings.iter().max_by_key(|f| severity(f.kind)))
                .cloned();
            if let Some(finding) = finding {
                let campaign_id = campaigns::get(conn, campaign_id)?.map(|c| c.id);
                return Ok(vec![Target {
                    recipient_id,
                    email,
                    campaign_id,
                    finding,
                }]);
            }
        }
    }
    // 2. The addresses the report names; the campaign from the returned
    //    message's Message-ID when it is one of ours for that recipient.
    let ours: Vec<(i64, i64)> = report
        .message_ids
        .iter()
        .filter_map(|id| compose::read_message_id(id, &identity.database_id))
        .collect();
    let mut targets: Vec<Target> = Vec::new();
    for f in &report.findings {
        let found = match &f.address {
            Some(a) => bounces::find_recipient(conn, a)?,
            // 3. No address at all: the returned message's Message-ID.
            None => match ours.first() {
                Some(&(_, rid)) => email_of(conn, rid)?.map(|e| (rid, e)),
                None => None,
            },
        };
        let Some((recipient_id, email)) = found else {
            continue;
        };
        if targets.iter().any(|t| t.recipient_id == recipient_id) {
            continue;
        }
        let campaign_id = match ours.iter().find(|&&(_, r)| r == recipient_id) {
            Some(&(c, _)) => campaigns::get(conn, c)?.map(|c| c.id),
            None => None,
        };
        targets.push(Target {
            recipient_id,
            email,
            campaign_id,
            finding: f.clone(),
        });
    }
    Ok(targets)
}

/// How much a finding weighs when one has to be picked.
fn severity(kind: BounceKind) -> u8 {
    match kind {
        BounceKind::Complaint => 5,
        BounceKind::Hard => 4,
        BounceKind::Policy => 3,
        BounceKind::Soft => 2,
        BounceKind::Feedback => 1,
        BounceKind::Delayed => 0,
    }
}

/// The (campaign, recipient) of an address `local+TOKEN@domain` whose
/// token is genuine.
pub fn read_verp(identity: &Identity, address: &str) -> Option<(i64, i64)> {
    let address = address.trim().trim_start_matches('<').trim_end_matches('>');
    let (local, _) = address.rsplit_once('@')?;
    let (_, token) = local.split_once('+')?;
    identity.signer.read_verp(token)
}

fn email_of(conn: &mut Conn, recipient_id: i64) -> Result<Option<String>, StoreError> {
    Ok(crate::store::recipients::load(conn, &[recipient_id])?
        .pop()
        .map(|r| r.email))
}

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
            Handled::Recorded(_) => summary.recorded += 1,
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
