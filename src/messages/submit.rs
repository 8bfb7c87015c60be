//! Submitting one transactional message, and reading it back. The
//! database decides idempotency: the unique index on the key lets one
//! insert through, whatever the number of concurrent retries, and the
//! stored hash of (template, to, data) tells a retry (same id, no second
//! send) from another message under a used key (refused).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{LazyLock, Mutex};

use lettre::message::Mailbox;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::queue::message::{Band, MessageJob};
use crate::queue::Server;
use crate::store::messages::{self, Message, MessageStatus, NewMessage};
use crate::store::{forgotten, installation, message_templates, now_ms, suppressions, Conn};
use crate::tokens::Identity;

use super::MessageError;

/// Largest `data` object, serialised.
pub const MAX_DATA: usize = 64 * 1024;
/// Longest idempotency key.
pub const MAX_KEY: usize = 255;
/// A retry of a message still queued this long after it was stored puts
/// its job again: the first put may have failed (beanstalkd down) after
/// the row was written. A second job is harmless (the claim is once);
/// the age keeps concurrent retries of one key from putting one each.
const REPUT_AFTER_MS: i64 = 10_000;

/// Where message jobs go: the workers' beanstalkd servers and tube.
#[derive(Debug, Clone)]
pub struct Queue {
    pub servers: Vec<SocketAddr>,
    pub tube: String,
}

/// One message to send.
#[derive(Debug, Clone)]
pub struct Submit {
    pub template: String,
    /// An address or `Name <address>`.
    pub to: String,
    /// A JSON object (`data.KEY` in the template), or none.
    pub data: Option<Value>,
    pub idempotency_key: Option<String>,
}

/// What a submit answers.
#[derive(Debug, Clone, Serialize)]
pub struct Submitted {
    pub id: i64,
    pub status: MessageStatus,
    /// False when the key named an earlier submit of the same message.
    pub created: bool,
}

/// A message as `GET /api/v1/messages/{id}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct MessageView {
    pub id: i64,
    pub template: String,
    pub to: String,
    pub status: MessageStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
}

/// `to` as a mailbox that can go on the wire.
pub fn parse_to(raw: &str) -> Result<Mailbox, MessageError> {
    let bad = || MessageError::BadTo(raw.to_string());
    if raw.chars().any(char::is_control) || raw.len() > 1000 {
        return Err(bad());
    }
    let mailbox = Mailbox::from_str(raw.trim()).map_err(|_| bad())?;
    crate::mailbox::for_transport(&mailbox.email).map_err(|_| bad())?;
    Ok(mailbox)
}

fn check(s: &Submit) -> Result<(Mailbox, String), MessageError> {
    let to = parse_to(&s.to)?;
    let data = match &s.data {
        None => "{}".to_string(),
        Some(v @ Value::Object(_)) => {
            serde_json::to_string(v).map_err(|e| MessageError::BadData(e.to_string()))?
        }
        Some(_) => return Err(MessageError::BadData("data must be a JSON object".into())),
    };
    if data.len() > MAX_DATA {
        return Err(MessageError::BadData(format!(
            "data is {} bytes, more than the limit of {MAX_DATA}",
            data.len()
        )));
    }
    if let Some(k) = &s.idempotency_key {
        if k.is_empty() || k.len() > MAX_KEY || k.chars().any(|c| c.is_control()) {
            return Err(MessageError::BadKey(format!(
                "use 1 to {MAX_KEY} printable characters"
            )));
        }
    }
    Ok((to, data))
}

/// The hash that tells a retry from another message under the same key.
fn body_hash(template: &str, to: &str, data: &str) -> String {
    let mut h = Sha256::new();
    for part in [template, to, data] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    data_encoding::HEXLOWER.encode(&h.finalize())
}

/// Who asked for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskedBy {
    /// The shop: the API, `mailsplit send`, a flow step.
    Sender,
    /// The recipient, on a form (the confirmation mail of a sign-up they
    /// made): an erasure does not stop it, since confirming is how a
    /// forgotten person comes back.
    Recipient,
}

/// Why no message may be stored for an address on the suppression list:
/// refused at once (422 over HTTP), so the caller knows now instead of
/// reading `suppressed` later. Entries added after a submit are still
/// applied when a worker claims the message.
const ON_THE_LIST: &str = "the address is on the suppression list (`mailsplit suppress ls`; `suppress rm` takes it off): nothing is sent to it";
/// Why no message may be stored for an erased address (unless its owner
/// asked for it: see [`AskedBy::Recipient`]).
const ERASED: &str = "the address was erased at its owner's request (`subscriber forget`): nothing is sent to it until the person confirms a double-opt-in sign-up";

/// Store a message and queue it (or find the one its key names), for
/// the shop ([`AskedBy::Sender`]).
pub fn submit(conn: &mut Conn, queue: &Queue, s: Submit) -> Result<Submitted, MessageError> {
    submit_as(conn, queue, s, AskedBy::Sender)
}

/// [`submit`], saying who asked.
pub fn submit_as(
    conn: &mut Conn,
    queue: &Queue,
    s: Submit,
    asked: AskedBy,
) -> Result<Submitted, MessageError> {
    let stored = store(conn, s, asked)?;
    // A retry of a message still queued long after it was stored puts its
    // job again: the first put may have failed.
    let stale = stored.waiting && now_ms() - stored.created_at > REPUT_AFTER_MS;
    if stored.waiting && (stored.submitted.created || stale) {
        put(
            queue,
            &stored.identity,
            &[stored.submitted.id],
            Band::Transactional,
        )
        .map_err(MessageError::Queue)?;
    }
    Ok(stored.submitted)
}

/// A message stored (or found under its key), its job not yet put.
pub struct Stored {
    pub submitted: Submitted,
    /// Queued and in no worker's hands: its job is to be put (once if it
    /// is new; again if the first put may have failed).
    pub waiting: bool,
    pub created_at: i64,
    /// What signs its job.
    pub identity: Identity,
}

/// Store a message (or find the one its key names) without queueing it.
/// The caller puts the job after its transaction commits (see [`put`]):
/// a job never names a row not yet committed.
pub fn store(conn: &mut Conn, s: Submit, asked: AskedBy) -> Result<Stored, MessageError> {
    let ready = conn.reads(|c| look_up(c, vec![s], asked))?;
    let one = ready.into_iter().next().expect("one answer per submit");
    store_ready(conn, one?)
}

/// A submit checked and its reads done: what storing it writes.
pub struct Ready {
    idempotency_key: Option<String>,
    template_id: i64,
    template_name: String,
    to: String,
    data: String,
    /// Why the message is stored `suppressed` rather than queued.
    suppressed: Option<&'static str>,
    identity: Identity,
}

/// Store a message whose reads are done (see [`look_up`]), or find the
/// one its key names.
pub fn store_ready(conn: &mut Conn, r: Ready) -> Result<Stored, MessageError> {
    let one = store_ready_many(conn, vec![r])?.pop();
    one.expect("one answer per message")
}

/// [`store_ready`] for a batch: one INSERT for the messages under keys
/// (see [`messages::insert_many`]); what each found, in order.
pub fn store_ready_many(
    conn: &mut Conn,
    readies: Vec<Ready>,
) -> Result<Vec<Result<Stored, MessageError>>, MessageError> {
    let now = now_ms();
    let hashes: Vec<String> = readies
        .iter()
        .map(|r| body_hash(&r.template_name, &r.to, &r.data))
        .collect();
    let rows: Vec<NewMessage> = readies
        .iter()
        .zip(&hashes)
        .map(|(r, hash)| NewMessage {
            template_id: r.template_id,
            template_name: &r.template_name,
            to_addr: &r.to,
            data: &r.data,
            idempotency_key: r.idempotency_key.as_deref(),
            body_hash: hash,
            status: match r.suppressed {
                Some(_) => MessageStatus::Suppressed,
                None => MessageStatus::Queued,
            },
            reply: r.suppressed,
            now,
        })
        .collect();
    let filed = messages::insert_many(conn, &rows)?;
    drop(rows);
    Ok(readies
        .into_iter()
        .zip(filed)
        .map(|(r, filed)| match filed {
            Some(f) => Ok(Stored {
                submitted: Submitted {
                    id: f.id,
                    status: f.status.public(),
                    created: f.created,
                },
                waiting: f.status == MessageStatus::Queued,
                created_at: f.created_at,
                identity: r.identity,
            }),
            None => Err(MessageError::KeyReused(
                r.idempotency_key.unwrap_or_default(),
            )),
        })
        .collect())
}

/// What the ledger says of a batch's addresses (by mailbox key): on the
/// suppression list (and why), erased (unless the recipient asked), and
/// their recipient rows.
struct Addresses {
    listed: HashMap<String, String>,
    erased: std::collections::HashSet<String>,
    on_file: HashMap<String, messages::Addressee>,
}

impl Addresses {
    fn read(conn: &mut Conn, keys: &[String], asked: AskedBy) -> Result<Addresses, MessageError> {
        let erased = match asked {
            AskedBy::Sender => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                forgotten::among(conn, &keys)?
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            }
            AskedBy::Recipient => Default::default(),
        };
        Ok(Addresses {
            listed: suppressions::matching(conn, keys)?,
            erased,
            on_file: messages::addressees(conn, keys)?,
        })
    }
}

/// Check each submit and read what storing it takes: its template, the
/// refusals and suppressions of its address, the installation's identity
/// (its job's signature). A batch costs a few statements whatever its
/// size (the flows' scheduler submits a batch of due steps at a time);
/// the caller holds one read transaction for it, so the reads take the
/// database's locks once and its writes come after, in a short write
/// transaction.
pub fn look_up(
    conn: &mut Conn,
    submits: Vec<Submit>,
    asked: AskedBy,
) -> Result<Vec<Result<Ready, MessageError>>, MessageError> {
    let checked: Vec<Result<Checked, MessageError>> =
        submits.into_iter().map(Checked::new).collect();
    let keys: Vec<String> = checked.iter().flatten().map(|c| c.key.clone()).collect();
    let addresses = Addresses::read(conn, &keys, asked)?;
    let identity = Identity::from(&installation::load(conn)?);
    let mut templates = HashMap::new();
    let mut out = Vec::with_capacity(checked.len());
    for c in checked {
        out.push(match c {
            Ok(c) => ready(conn, c, &addresses, &mut templates, &identity)?,
            Err(e) => Err(e),
        });
    }
    Ok(out)
}

/// A submit that passed [`check`]: its mailbox, its data as JSON text,
/// and its address's mailbox key.
struct Checked {
    s: Submit,
    to: Mailbox,
    data: String,
    key: String,
}

impl Checked {
    fn new(s: Submit) -> Result<Checked, MessageError> {
        let (to, data) = check(&s)?;
        let key = crate::mailbox::key(to.email.as_ref())
            .map_err(|_| MessageError::BadTo(s.to.clone()))?;
        Ok(Checked { s, to, data, key })
    }
}

/// The templates a batch names, by name, each read once: its id and
/// whether it is of the marketing stream (none: no such template).
type Templates = HashMap<String, Option<(i64, bool)>>;

/// What storing checked submit `c` writes, or why it is refused (`Err`
/// inside); the outer `Err`: the database could not be read.
fn ready(
    conn: &mut Conn,
    c: Checked,
    addresses: &Addresses,
    templates: &mut Templates,
    identity: &Identity,
) -> Result<Result<Ready, MessageError>, MessageError> {
    let Checked { s, to, data, key } = c;
    if !templates.contains_key(&s.template) {
        let t = message_templates::find(conn, &s.template)?
            .map(|t| (t.id, t.stream == message_templates::Stream::Marketing));
        templates.insert(s.template.clone(), t);
    }
    let Some(Some((template_id, marketing))) = templates.get(&s.template).copied() else {
        return Ok(Err(MessageError::UnknownTemplate(s.template)));
    };
    let refused = if addresses.listed.contains_key(&key) {
        Some(ON_THE_LIST)
    } else if addresses.erased.contains(&key) {
        Some(ERASED)
    } else {
        None
    };
    // A retry under a key stored before the refusal gets that message.
    if let Some(why) = refused {
        let retry = match s.idempotency_key.as_deref() {
            Some(k) => messages::key_used(conn, k)?,
            None => false,
        };
        if !retry {
            return Ok(Err(MessageError::Refused(why)));
        }
    }
    Ok(Ok(Ready {
        suppressed: addresses
            .on_file
            .get(&key)
            .and_then(|a| a.suppressed(marketing)),
        idempotency_key: s.idempotency_key,
        template_id,
        template_name: s.template,
        to: to.to_string(),
        data,
        identity: identity.clone(),
    }))
}

/// Connections to beanstalkd kept between puts, per (server, tube): a
/// submit reuses one instead of connecting anew (a TCP handshake and a
/// `use` on both sides for every message).
static CONNECTIONS: LazyLock<Mutex<Kept>> = LazyLock::new(Mutex::default);
/// Idle connections by (server, tube).
type Kept = HashMap<(SocketAddr, String), Vec<Server>>;
/// Idle connections kept per (server, tube); more are closed after use.
const IDLE_CONNECTIONS: usize = 16;

/// Put the job of messages `ids` (one, or a batch of up to
/// [`crate::queue::message::MAX_BATCH`]) in `band` on the first server
/// that takes it.
pub fn put(
    queue: &Queue,
    identity: &Identity,
    ids: &[i64],
    band: Band,
) -> Result<(), crate::queue::QueueError> {
    let body = MessageJob {
        messages: ids.to_vec(),
        band,
    }
    .encode(identity);
    let mut last = None;
    // Spread over the servers by id; each is tried once.
    let n = queue.servers.len().max(1);
    let first = ids.first().copied().unwrap_or_default();
    for i in 0..queue.servers.len() {
        let addr = queue.servers[(first as usize + i) % n];
        match put_on(addr, &queue.tube, &body, band.priority()) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Put `body` at `priority` on `addr`'s `tube`, on a kept connection if
/// there is one. A kept connection that fails (the server restarted
/// since) is dropped and the put made once more on a new one: a job put
/// twice is harmless, the ledger's claim sends a message once.
fn put_on(
    addr: SocketAddr,
    tube: &str,
    body: &[u8],
    priority: u32,
) -> Result<(), crate::queue::QueueError> {
    let key = (addr, tube.to_string());
    let kept = lock(&CONNECTIONS).get_mut(&key).and_then(Vec::pop);
    if let Some(mut server) = kept {
        if server.put(body, priority).is_ok() {
            keep(key, server);
            return Ok(());
        }
    }
    let mut server = Server::connect(addr)?;
    server.use_tube(tube)?;
    server.put(body, priority)?;
    keep(key, server);
    Ok(())
}

fn keep(key: (SocketAddr, String), server: Server) {
    let mut all = lock(&CONNECTIONS);
    let idle = all.entry(key).or_default();
    if idle.len() < IDLE_CONNECTIONS {
        idle.push(server);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Message `id` as the API shows it.
pub fn get(conn: &mut Conn, id: i64) -> Result<MessageView, MessageError> {
    let m = messages::find(conn, id)?.ok_or(MessageError::UnknownMessage(id))?;
    Ok(view(m))
}

fn view(m: Message) -> MessageView {
    MessageView {
        id: m.id,
        template: m.template_name,
        to: m.to_addr,
        status: m.status.public(),
        reply: m.reply,
        created_at: rfc3339(m.created_at),
        sent_at: m.sent_at.map(rfc3339),
    }
}

fn rfc3339(ms: i64) -> String {
    crate::clock::rfc3339(ms, crate::clock::Precision::Millis)
}
