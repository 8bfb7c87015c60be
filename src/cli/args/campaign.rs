//! `templates`: the built-in starters a campaign's content can begin from.

use clap::Subcommand;

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
