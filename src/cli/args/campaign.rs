//! `campaign create` and `campaign edit`'s options, and `templates`: the
//! built-in starters a campaign's content can begin from.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::AbArgs;
use crate::campaign::{ContentSource, CreateRequest, EditRequest};

/// `campaign create`'s options (its help is the command's own).
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Unique campaign name
    pub name: String,
    /// Recipient list (from `mailsplit import --list`)
    #[arg(long)]
    pub list: String,
    /// HTML file: a Jinja template (name, email, attributes.KEY,
    /// unsubscribe_url, campaign.name); its <style> CSS is inlined
    #[arg(long, value_name = "FILE", group = "content")]
    pub html: Option<PathBuf>,
    /// Text part for --html (default: derived from the HTML)
    #[arg(long, value_name = "FILE", requires = "html")]
    pub text: Option<PathBuf>,
    /// Markdown file (a Jinja template too): both parts are made from it
    #[arg(long, value_name = "FILE", group = "content")]
    pub markdown: Option<PathBuf>,
    /// A built-in starter template (see `mailsplit templates`)
    #[arg(long, value_name = "NAME", group = "content")]
    pub template: Option<String>,
    /// Subject line, a Jinja template too ("Hi {{ name }}")
    #[arg(long)]
    pub subject: String,
    /// Sender address, e.g. news@example.com or "Shop <news@example.com>"
    #[arg(long)]
    pub from: String,
    /// beanstalkd priority, lower is sooner. Default: smaller lists get
    /// a lower number, so a small campaign overtakes a big one.
    #[arg(long)]
    pub priority: Option<u32>,
    /// Where `mailsplit serve` is reachable from the internet, e.g.
    /// https://mail.example.com: every message gets a one-click
    /// unsubscribe link <public-url>/u/TOKEN (List-Unsubscribe, and the
    /// templates' unsubscribe link). https only; http for loopback hosts
    #[arg(long, env = "MAILSPLIT_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// VERP return path, e.g. bounces@bounce.example.com: each message's
    /// envelope sender becomes bounces+TOKEN@bounce.example.com, and
    /// that domain's mail goes to `mailsplit bounce` (see its --help)
    #[arg(long, env = "MAILSPLIT_RETURN_PATH")]
    pub return_path: Option<String>,
    /// Workers pause the campaign when more than this share of its last
    /// 250-500 messages failed, or 100 failed in a row: 20%, 0.2, or off
    #[arg(long, default_value = "20%")]
    pub max_failure_rate: String,
    /// Workers pause the campaign when complaints (spam reports read by
    /// `mailsplit bounce`) pass this share of its delivered messages,
    /// once 1,000 are delivered: 0.3% (Gmail's and Yahoo's bulk-sender
    /// limit), 0.001, or off. `status` says why it paused
    #[arg(long, default_value = "0.3%")]
    pub max_complaint_rate: String,
    /// Start no earlier than this (RFC 3339, e.g.
    /// 2026-12-01T09:00:00+01:00); `enqueue` may run any time before,
    /// no message leaves before it. A past time is refused
    #[arg(long, value_name = "TIME")]
    pub send_at: Option<String>,
    /// Track opens (a 1x1 image <public-url>/o/TOKEN) and/or clicks
    /// (http(s) links rewritten to <public-url>/c/TOKEN/N): opens,
    /// clicks, opens,clicks or none (the default); needs --public-url
    #[arg(long, value_name = "opens,clicks")]
    pub track: Option<String>,
    #[command(flatten)]
    pub ab: AbArgs,
}

impl CreateArgs {
    /// The stage's request.
    pub fn request(self) -> CreateRequest {
        CreateRequest {
            name: self.name,
            list: self.list,
            content: content_source(self.html, self.text, self.markdown, self.template),
            subject: self.subject,
            from: self.from,
            priority: self.priority,
            public_url: self.public_url,
            return_path: self.return_path,
            max_failure_rate: self.max_failure_rate,
            max_complaint_rate: self.max_complaint_rate,
            send_at: self.send_at,
            track: self.track,
            ab: self.ab.request(),
        }
    }
}

/// The one content option clap let through.
fn content_source(
    html: Option<PathBuf>,
    text: Option<PathBuf>,
    markdown: Option<PathBuf>,
    template: Option<String>,
) -> ContentSource {
    match (html, markdown, template) {
        (Some(html), _, _) => ContentSource::Html { html, text },
        (_, Some(md), _) => ContentSource::Markdown(md),
        (_, _, name) => ContentSource::Template(name.unwrap_or_default()),
    }
}

/// `campaign edit`'s options (its help is the command's own).
#[derive(Args, Debug)]
pub struct EditArgs {
    /// Campaign name or id
    pub name: String,
    /// New subject line (a Jinja template)
    #[arg(long)]
    pub subject: Option<String>,
    /// New HTML file (as for create)
    #[arg(long, value_name = "FILE", group = "body")]
    pub html: Option<PathBuf>,
    /// New text part (with --html, or alone for --html content)
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// New Markdown file (as for create)
    #[arg(long, value_name = "FILE", group = "body", conflicts_with = "text")]
    pub markdown: Option<PathBuf>,
    /// New sender address
    #[arg(long)]
    pub from: Option<String>,
    /// New start time (RFC 3339), or `now`: a scheduled campaign's
    /// workers see it within a second (alone, it stores no new content
    /// version)
    #[arg(long, value_name = "TIME")]
    pub send_at: Option<String>,
    /// What to track from now on: opens, clicks, opens,clicks, or none
    /// (or empty) to stop
    #[arg(long, value_name = "opens,clicks")]
    pub track: Option<String>,
}

impl EditArgs {
    /// The stage's request.
    pub fn request(self) -> EditRequest {
        EditRequest {
            name: self.name,
            subject: self.subject,
            html: self.html,
            text: self.text,
            markdown: self.markdown,
            from: self.from,
            send_at: self.send_at,
            track: self.track,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum TemplatesCommand {
    /// Print a built-in starter's source (HTML and text, Jinja syntax), to
    /// copy into your own files for `campaign create --html FILE --text FILE`
    Show {
        /// Template name (see `mailsplit templates`)
        name: String,
        /// Only the HTML part
        #[arg(long, conflicts_with = "text")]
        html: bool,
        /// Only the text part
        #[arg(long)]
        text: bool,
    },
}
