//! `mailsplit template …` and `mailsplit send`, as clap sees them.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum TemplateCommand {
    /// Store a message template (content checked as a campaign's; may use data.KEY)
    Create {
        /// Template name (letters, digits, '-', '_', '.')
        name: String,
        #[command(flatten)]
        content: TemplateContent,
        /// Subject (a Jinja template)
        #[arg(long)]
        subject: String,
        /// Sender: user@example.com or "Name <user@example.com>"
        #[arg(long)]
        from: String,
        /// transactional (ignores marketing unsubscribes) or marketing (honours them, adds List-Unsubscribe)
        #[arg(long, default_value = "transactional", value_parser = ["transactional", "marketing"])]
        stream: String,
        /// VERP return path, e.g. bounces@bounce.example.com: each
        /// message's envelope sender becomes bounces+TOKEN@…, so a bounce
        /// that `mailsplit bounce` reads later marks that message `bounced`
        #[arg(long, env = "MAILSPLIT_RETURN_PATH")]
        return_path: Option<String>,
        /// Track opens (a 1x1 image <public-url>/o/TOKEN) and/or clicks
        /// (http(s) links rewritten to <public-url>/l/TOKEN): opens,
        /// clicks, opens,clicks or none (the default); needs --public-url
        #[arg(long)]
        track: Option<String>,
        /// Where `mailsplit serve` answers: the tracking links, and a
        /// marketing message's preferences_url (/p/TOKEN) and view_url
        /// (/v/TOKEN)
        #[arg(long, env = "MAILSPLIT_PUBLIC_URL")]
        public_url: Option<String>,
    },
    /// Change a message template: a new version; messages sent from now on use it
    Edit {
        name: String,
        #[command(flatten)]
        content: TemplateContent,
        #[arg(long)]
        subject: Option<String>,
        #[arg(long)]
        from: Option<String>,
        #[arg(long, value_parser = ["transactional", "marketing"])]
        stream: Option<String>,
        /// New VERP return path; an empty value removes it
        #[arg(long)]
        return_path: Option<String>,
        /// opens, clicks, opens,clicks or none (stops tracking)
        #[arg(long)]
        track: Option<String>,
        /// New public URL; an empty value removes it
        #[arg(long)]
        public_url: Option<String>,
    },
    /// Every message template: name, stream, version, subject, from
    Ls {
        /// One JSON object per line
        #[arg(long)]
        json: bool,
    },
    /// Remove a message template (its messages keep its name)
    Rm { name: String },
}

/// `--html FILE [--text FILE] | --markdown FILE`.
#[derive(Args, Debug, Clone)]
pub struct TemplateContent {
    /// HTML part (a Jinja template; CSS is inlined)
    #[arg(long, value_name = "FILE", group = "body")]
    pub html: Option<PathBuf>,
    /// Text part for --html (default: derived from the HTML)
    #[arg(long, value_name = "FILE", requires = "html")]
    pub text: Option<PathBuf>,
    /// Markdown content (a Jinja template), converted to HTML and text
    #[arg(long, value_name = "FILE", group = "body")]
    pub markdown: Option<PathBuf>,
}

/// `mailsplit send TEMPLATE --to ADDR …`.
#[derive(Args, Debug)]
pub struct SendArgs {
    /// Message template name
    pub template: String,
    /// Recipient: user@example.com or "Name <user@example.com>"
    #[arg(long)]
    pub to: String,
    /// A JSON object, the template's `data`
    #[arg(long)]
    pub data: Option<String>,
    /// The same key and message give the same id and no second send
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Print {"id","status"} as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum MessageCommand {
    /// One transactional message: template, to, status, the relay's reply, times
    Show {
        /// The id `send` printed
        id: i64,
        #[arg(long)]
        json: bool,
    },
}
