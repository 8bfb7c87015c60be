//! The user's own content, rendered at run time with minijinja (Jinja
//! syntax). A campaign's subject, HTML and text templates are compiled once
//! per content version per process ([`Cache`], keyed by campaign id and
//! version) and rendered per message. The engine is built without
//! `include`/`import`/`extends` (minijinja's `multi_template` feature is
//! off, so those tags do not even parse), without a loader and without any
//! function that reaches files, the environment or the network. The HTML
//! part is auto-escaped; the subject and text parts are not.
//!
//! Every render runs under a budget (see [`RENDER_FUEL`] and
//! [`DEFAULT_MAX_MESSAGE`]): a template that loops too long or builds too
//! much fails that one message with [`RenderError`], whatever the
//! recipient's data makes it do, and the output stops growing at the cap
//! while it is written rather than after.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex};

use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};
use serde::Serialize;
use serde_json::{Map, Value};

mod problems;
pub use problems::TemplateProblem;
use problems::{add, render_problem};

/// The names a template may use at the top level.
pub const VARIABLES: &[&str] = &[
    "name",
    "email",
    "attributes",
    "unsubscribe_url",
    "preferences_url",
    "view_url",
    "campaign",
];

/// minijinja's own globals (with the `builtins` feature, without `debug`).
const GLOBALS: &[&str] = &["range", "dict", "namespace", "loop"];

/// Template names inside one [`Compiled`] environment.
const SUBJECT: &str = "subject";
const HTML: &str = "html";
const TEXT: &str = "text";

/// What one message's templates see.
#[derive(Serialize)]
pub struct Vars<'a> {
    /// Left out when empty, so `{{ name | default("friend") }}` works.
    #[serde(skip_serializing_if = "is_blank")]
    pub name: &'a str,
    pub email: &'a str,
    /// Empty values are left out too: a missing attribute renders empty.
    pub attributes: Map<String, Value>,
    pub unsubscribe_url: &'a str,
    /// The recipient's preference centre (`/p/TOKEN`) and their message in
    /// a browser (`/v/TOKEN`); empty without a public URL.
    pub preferences_url: String,
    pub view_url: String,
    pub campaign: CampaignVars<'a>,
    /// Tracking (see [`super::tracking`]): the open pixel's URL and the
    /// click URLs, which only a tracked version's rewritten templates name.
    #[serde(rename = "__mailsplit_open", skip_serializing_if = "Option::is_none")]
    pub open_url: Option<String>,
    #[serde(rename = "__mailsplit_links", skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<String>,
    /// What makes the click URLs of links the template writes (see
    /// [`super::template_links`]); never rendered itself.
    #[serde(rename = "__mailsplit_linker", skip_serializing_if = "Option::is_none")]
    pub linker: Option<minijinja::Value>,
    /// A transactional message's own data (`data.KEY`); campaigns have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// A flow step's row from its SQL trigger (`row.COL`): the `row`
    /// member of the message's data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row: Option<Value>,
}

fn is_blank(s: &&str) -> bool {
    s.trim().is_empty()
}

#[derive(Serialize)]
pub struct CampaignVars<'a> {
    pub name: &'a str,
    /// The rendered subject, for the HTML and text parts (the starters
    /// put it in `<title>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

impl<'a> Vars<'a> {
    pub fn new(
        name: &'a str,
        email: &'a str,
        attributes: &Map<String, Value>,
        unsubscribe_url: &'a str,
        campaign: &'a str,
    ) -> Vars<'a> {
        let attributes = attributes
            .iter()
            .filter(|(_, v)| !matches!(v, Value::Null) && v.as_str() != Some(""))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Vars {
            name,
            email,
            attributes,
            unsubscribe_url,
            preferences_url: String::new(),
            view_url: String::new(),
            campaign: CampaignVars {
                name: campaign,
                subject: None,
            },
            open_url: None,
            links: Vec::new(),
            linker: None,
            data: None,
            row: None,
        }
    }

    /// A made-up recipient the templates are tried on when they are stored.
    pub fn sample(campaign: &'a str) -> Vars<'a> {
        let mut vars = Vars::new(
            "Sample Recipient",
            "sample@example.com",
            &Map::new(),
            "https://example.com/u/sample",
            campaign,
        );
        vars.preferences_url = "https://example.com/p/sample".into();
        vars.view_url = "https://example.com/v/sample".into();
        vars
    }
}

/// One content version's templates, compiled.
pub struct Compiled {
    env: Environment<'static>,
    /// What a tracked version's messages need (see [`super::tracking`]).
    pub tracking: Option<super::tracking_urls::TrackingUrls>,
    /// Whether the HTML and text parts are ours (else: a built-in starter).
    pub(super) has_body: bool,
    /// Bytes one message's rendered parts may hold together.
    max_message: usize,
    /// The subject when it is plain text, not rendered per message.
    pub(super) literal_subject: Option<String>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("has_body", &self.has_body)
            .finish()
    }
}

/// A fresh engine: lenient about undefined values (they render empty),
/// HTML-escaping the `html` template only.
fn engine() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_fuel(Some(RENDER_FUEL));
    env.set_auto_escape_callback(|name| {
        if name == HTML {
            AutoEscape::Html
        } else {
            AutoEscape::None
        }
    });
    env
}

/// The parts of a content version: the subject and, unless the campaign
/// uses a built-in starter, the HTML and text templates, each with the
/// file it came from (for error messages).
pub struct Sources<'a> {
    pub subject: (&'a str, &'a str),
    pub body: Option<[(&'a str, &'a str); 2]>,
}

impl Compiled {
    /// Compile and check every part: syntax, top-level names, and a trial
    /// render for a sample recipient (an unknown filter shows there).
    pub fn new(sources: &Sources, campaign: &str) -> Result<Compiled, TemplateProblem> {
        Compiled::build(sources, &[], &Vars::sample(campaign))
    }

    /// [`Compiled::new`] for templates that may also name `extra`
    /// top-level variables (a message template's `data`), tried with each
    /// of them an empty object.
    pub fn with_vars(
        sources: &Sources,
        name: &str,
        extra: &[&str],
    ) -> Result<Compiled, TemplateProblem> {
        Compiled::build(sources, extra, &sample_with(name, extra))
    }

    /// [`Compiled::new`] for templates that tracking rewrote: they may
    /// also name the tracking variables (the user's own never can).
    /// `links`: how many links the rewritten templates name.
    pub fn tracked(
        sources: &Sources,
        campaign: &str,
        links: usize,
    ) -> Result<Compiled, TemplateProblem> {
        Compiled::tracked_with(sources, campaign, links, &[])
    }

    /// [`Compiled::tracked`] for templates that may also name `extra`
    /// (a message template's, see [`Compiled::with_vars`]).
    pub fn tracked_with(
        sources: &Sources,
        name: &str,
        links: usize,
        extra: &[&str],
    ) -> Result<Compiled, TemplateProblem> {
        let mut sample = sample_with(name, extra);
        sample.open_url = Some("https://example.com/o/sample".into());
        sample.links = (1..=links)
            .map(|n| format!("https://example.com/c/sample/{n}"))
            .collect();
        let mut names = vec![
            super::tracking_urls::OPEN_VAR,
            super::tracking_urls::LINKS_VAR,
        ];
        names.extend_from_slice(extra);
        Compiled::build(sources, &names, &sample)
    }

    fn build(
        sources: &Sources,
        extra: &[&str],
        sample: &Vars,
    ) -> Result<Compiled, TemplateProblem> {
        let mut env = engine();
        let mut parts = vec![(SUBJECT, sources.subject)];
        if let Some([html, text]) = sources.body {
            parts.push((HTML, html));
            parts.push((TEXT, text));
        }
        if !extra.is_empty() {
            // Rewritten templates wrap template-written links in it.
            let name = super::template_links::TRACK_FILTER;
            env.add_filter(name, super::template_links::track);
        }
        for (key, (file, source)) in &parts {
            add(&mut env, key, file, source, extra)?;
        }
        let compiled = Compiled {
            env,
            tracking: None,
            has_body: sources.body.is_some(),
            max_message: DEFAULT_MAX_MESSAGE,
            literal_subject: None,
        };
        let mut room = compiled.max_message;
        for (key, (file, _)) in &parts {
            compiled
                .render_one(key, sample, &mut room)
                .map_err(|e| render_problem(file, &e))?;
        }
        // Rendered as itself for every recipient: no `{` (no tag,
        // expression or comment), no line break (one trailing is dropped).
        let subject = sources.subject.1;
        let literal_subject = (!subject.contains(['{', '\r', '\n'])).then(|| subject.to_string());
        Ok(Compiled {
            literal_subject,
            ..compiled
        })
    }

    /// The subject, and the room left for the HTML and text parts under
    /// the size cap.
    pub fn subject(&self, vars: &Vars) -> Result<(String, usize), RenderError> {
        let mut room = self.max_message;
        match &self.literal_subject {
            // What its render writes, in one write `Capped` takes whole.
            Some(text) if text.len() <= room => Ok((text.clone(), room - text.len())),
            Some(_) => Err(RenderError::TooLarge { cap: room }),
            None => Ok((self.render_one(SUBJECT, vars, &mut room)?, room)),
        }
    }

    /// The HTML and text parts in the `room` [`Compiled::subject`] left;
    /// `None` for a built-in starter. Set `vars.campaign.subject` first.
    pub fn body(
        &self,
        vars: &Vars,
        mut room: usize,
    ) -> Result<Option<(String, String)>, RenderError> {
        if !self.has_body {
            return Ok(None);
        }
        Ok(Some((
            self.render_one(HTML, vars, &mut room)?,
            self.render_one(TEXT, vars, &mut room)?,
        )))
    }

    /// The attributes the templates name (`attributes.city`), or `None`
    /// when every one may be read: a template uses `attributes` as a whole
    /// (a loop, a lookup by a computed key), or the body is a built-in
    /// starter.
    pub fn attributes_used(&self) -> Option<BTreeSet<String>> {
        if !self.has_body {
            return None;
        }
        let mut used = BTreeSet::new();
        for key in [SUBJECT, HTML, TEXT] {
            let Ok(template) = self.env.get_template(key) else {
                return None;
            };
            for name in template.undeclared_variables(true) {
                if name == "attributes" {
                    return None;
                }
                if let Some(path) = name.strip_prefix("attributes.") {
                    let first = path.split('.').next().unwrap_or(path);
                    used.insert(first.to_string());
                }
            }
        }
        Some(used)
    }

    /// The cap on one message's size (see [`Cache::with_max_message`]).
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    /// Cap one message at `max` bytes (as the version it varies renders).
    pub fn set_max_message(&mut self, max: usize) {
        self.max_message = max;
    }
}

/// The sample recipient, with each of `extra`'s `data` and `row` an
/// empty object.
fn sample_with<'a>(name: &'a str, extra: &[&str]) -> Vars<'a> {
    let mut sample = Vars::sample(name);
    if extra.contains(&"data") {
        sample.data = Some(Value::Object(Map::new()));
    }
    if extra.contains(&"row") {
        sample.row = Some(Value::Object(Map::new()));
    }
    sample
}

/// Work one render may do: minijinja's fuel, one unit per instruction and
/// per 64 bytes of data made (strings, lists, output). A template passes
/// `campaign create` on a sample recipient and may loop or grow without
/// end for another's data; the fuel ends that render, and bounds the
/// memory it can take (`"x" * 100000000` is refused before it is made).
/// Chosen with a wide margin over the newsletters we know (the starters,
/// a loop over hundreds of products with filters: BENCHMARKS.md) and low
/// enough that a render that uses it all ends within a fraction of a
/// second and holds at most `64 * RENDER_FUEL` bytes.
pub const RENDER_FUEL: u64 = 500_000;

/// Default cap on one message's rendered parts (subject, HTML and text
/// together) and on the message built from them: far above any
/// newsletter, far below what a relay would take (and what a worker could
/// hold for each of its messages in flight). `worker --max-message-size`.
pub const DEFAULT_MAX_MESSAGE: usize = 10 * 1024 * 1024;

/// Why one message cannot be rendered. The budget errors are the
/// template's doing for this recipient, like a template error: the
/// recipient is failed, never retried.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("the template exceeds its render budget ({RENDER_FUEL} steps, or about {} MB of values and output, per part): a loop or a value too large for one message", RENDER_FUEL * 64 / 1_000_000)]
    Budget,
    #[error("the message exceeds the size cap of {} bytes ({} MB; worker --max-message-size)", .cap, .cap / (1024 * 1024))]
    TooLarge { cap: usize },
    #[error("{0:#}")]
    Template(#[from] minijinja::Error),
}

impl Compiled {
    /// Render one part into at most `room` bytes, taking what it wrote
    /// from `room`. The output stops at the cap as it is written: a
    /// template writing a large value many times never holds more.
    fn render_one(&self, key: &str, vars: &Vars, room: &mut usize) -> Result<String, RenderError> {
        let template = self.env.get_template(key)?;
        let mut out = Capped {
            out: Vec::new(),
            room: *room,
            over: false,
        };
        let rendered = template.render_captured_to(minijinja::value::Serde(vars), &mut out);
        if out.over {
            return Err(RenderError::TooLarge {
                cap: self.max_message,
            });
        }
        match rendered {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::OutOfFuel => return Err(RenderError::Budget),
            Err(e) => return Err(e.into()),
        }
        *room = out.room;
        // minijinja writes whole strings, and `Capped` takes a write whole
        // or not at all, so the bytes are UTF-8; lossy only to be total.
        Ok(String::from_utf8(out.out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

/// A render's output, refusing any write past `room` bytes.
struct Capped {
    out: Vec<u8>,
    room: usize,
    over: bool,
}

impl io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() > self.room {
            self.over = true;
            return Err(io::Error::other("the message size cap"));
        }
        self.room -= buf.len();
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Compiled content versions by (campaign id, version): each is compiled
/// once per process, never per message.
pub struct Cache {
    compiled: Mutex<HashMap<(i64, i64), Arc<Compiled>>>,
    /// The size cap the versions compiled here render under.
    max_message: usize,
}

impl Default for Cache {
    fn default() -> Cache {
        Cache::with_max_message(DEFAULT_MAX_MESSAGE)
    }
}

impl Cache {
    /// A cache whose versions cap a message at `max_message` bytes.
    pub fn with_max_message(max_message: usize) -> Cache {
        Cache {
            compiled: Mutex::default(),
            max_message,
        }
    }

    /// The compiled version, compiling it on first use.
    pub fn get_or_compile(
        &self,
        key: (i64, i64),
        compile: impl FnOnce() -> Result<Compiled, TemplateProblem>,
    ) -> Result<Arc<Compiled>, TemplateProblem> {
        if let Some(found) = self.lock().get(&key) {
            return Ok(Arc::clone(found));
        }
        let mut compiled = compile()?;
        compiled.max_message = self.max_message;
        let compiled = Arc::new(compiled);
        self.lock().insert(key, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// The compiled version, if it was compiled before.
    pub fn get(&self, key: (i64, i64)) -> Option<Arc<Compiled>> {
        self.lock().get(&key).map(Arc::clone)
    }

    /// How many versions were compiled (tests).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i64, i64), Arc<Compiled>>> {
        self.compiled.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests;
