//! What `campaign create` does with the content the user gives: read the
//! files, check each as a Jinja template (file, line and problem on
//! error), convert (Markdown to HTML, CSS inlined, text derived from the
//! HTML when none was given) and check the result once more, so what is
//! stored always compiles. Links no mail client follows safely are
//! refused, scripts warned about (see [`check_links`]).

use std::path::{Path, PathBuf};

use crate::compose::content::{Compiled, Sources, TemplateProblem};
use crate::compose::{html_scan, source};
use crate::store::content::ContentKind;
use crate::templates::{self, TemplateError};

/// Exactly one of `--html FILE [--text FILE]`, `--markdown FILE`,
/// `--template NAME`.
#[derive(Debug, Clone)]
pub enum ContentSource {
    Html {
        html: PathBuf,
        text: Option<PathBuf>,
    },
    Markdown(PathBuf),
    Template(String),
}

impl Default for ContentSource {
    fn default() -> Self {
        ContentSource::Template(String::new())
    }
}

/// Why the content cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Template(#[from] TemplateProblem),
    #[error(transparent)]
    Builtin(#[from] TemplateError),
    #[error("{file}: {problem}")]
    Convert { file: String, problem: String },
    #[error("{file}{}: link {url:?} refused: {why}; remove it or write an http(s) or mailto link", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Link {
        file: String,
        line: Option<usize>,
        url: String,
        why: &'static str,
    },
}

/// The templates to store, converted and checked.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub kind: ContentKind,
    pub subject: String,
    pub html: String,
    pub text: String,
    /// What `campaign list` and Feedback-ID call the content: the built-in
    /// template's name, or `html` / `markdown`.
    pub label: String,
    /// What the creator should hear about the content (scripts).
    pub warnings: Vec<String>,
}

/// A file's name (as shown in errors) and text.
pub(crate) fn read_file(path: &Path) -> Result<(String, String), ContentError> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((file, text)),
        Err(source) => Err(ContentError::Read { file, source }),
    }
}

/// Read, check and convert the content of a campaign named `campaign`.
pub fn prepare(
    campaign: &str,
    subject: &str,
    content: &ContentSource,
) -> Result<Prepared, ContentError> {
    prepare_for(campaign, subject, content, &[])
}

/// [`prepare`] for templates that may also name the `extra` top-level
/// variables (a message template's `data`).
pub fn prepare_for(
    campaign: &str,
    subject: &str,
    content: &ContentSource,
    extra: &[&str],
) -> Result<Prepared, ContentError> {
    let checker = Checker {
        campaign,
        subject,
        extra,
    };
    let parts = match content {
        ContentSource::Template(name) => {
            templates::check(name)?;
            checker.check(None)?;
            Parts {
                kind: ContentKind::Builtin,
                html: String::new(),
                text: String::new(),
                warnings: Vec::new(),
            }
        }
        ContentSource::Html { html, text } => from_html(&checker, html, text.as_deref())?,
        ContentSource::Markdown(path) => from_markdown(&checker, path)?,
    };
    // The converted parts compile too (a converter that broke a tag).
    if parts.kind != ContentKind::Builtin {
        checker.check(Some([
            ("HTML part", parts.html.as_str()),
            ("text part", parts.text.as_str()),
        ]))?;
    }
    let label = match content {
        ContentSource::Template(name) => name.clone(),
        _ => parts.kind.to_string(),
    };
    Ok(Prepared {
        kind: parts.kind,
        subject: subject.to_string(),
        html: parts.html,
        text: parts.text,
        label,
        warnings: parts.warnings,
    })
}

/// What the content's templates are compiled against: the campaign's
/// name, the subject, and the extra top-level variables they may name.
struct Checker<'a> {
    campaign: &'a str,
    subject: &'a str,
    extra: &'a [&'a str],
}

impl Checker<'_> {
    /// Compile the subject with `body` (`None`: a built-in template's own).
    fn check(&self, body: Option<[(&str, &str); 2]>) -> Result<(), TemplateProblem> {
        let sources = Sources {
            subject: ("--subject", self.subject),
            body,
        };
        Compiled::with_vars(&sources, self.campaign, self.extra).map(drop)
    }
}

/// The user's content converted: the parts to store and what the creator
/// should hear about them.
struct Parts {
    kind: ContentKind,
    html: String,
    text: String,
    warnings: Vec<String>,
}

/// A conversion's problem, said of the file it came from.
fn convert(file: &str) -> impl FnOnce(String) -> ContentError + '_ {
    move |problem| ContentError::Convert {
        file: file.to_string(),
        problem,
    }
}

/// `--html FILE [--text FILE]`: checked as written (line numbers are the
/// user's), CSS inlined, the text part derived when none was given.
fn from_html(checker: &Checker, html: &Path, text: Option<&Path>) -> Result<Parts, ContentError> {
    let (html_file, html) = read_file(html)?;
    let text = text.map(read_file).transpose()?;
    // The user's own files first: line numbers are theirs.
    let own_text = text.as_ref().map_or(("", ""), |(f, t)| (f, t));
    checker.check(Some([(&html_file, &html), own_text]))?;
    let warnings = check_links(&html_file, &html, true)?;
    let text = match text {
        Some((_, text)) => text,
        None => source::html_to_text(&html).map_err(convert(&html_file))?,
    };
    let html = source::inline_css(&html).map_err(convert(&html_file))?;
    Ok(Parts {
        kind: ContentKind::Html,
        html,
        text,
        warnings,
    })
}

/// `--markdown FILE`: checked as written, converted to HTML with CSS
/// inlined, the text part derived from it.
fn from_markdown(checker: &Checker, path: &Path) -> Result<Parts, ContentError> {
    let (file, markdown) = read_file(path)?;
    checker.check(Some([(&file, &markdown), ("", "")]))?;
    let html = source::markdown_to_html(&markdown);
    // Lines of the converted HTML are not the file's.
    let warnings = check_links(&file, &html, false)?;
    let text = source::html_to_text(&html).map_err(convert(&file))?;
    let html = source::inline_css(&html).map_err(convert(&file))?;
    Ok(Parts {
        kind: ContentKind::Markdown,
        html,
        text,
        warnings,
    })
}

/// Refuse the first literal link of `html` that no mail client follows
/// safely (see [`html_scan::refused_href`]), and return a warning for each
/// script (`<script>`, `on…=` handlers; see [`html_scan::scripts`]). Links
/// a template expression writes differ per recipient and are not seen
/// here. `lines`: whether offsets in `html` are the file's own lines.
pub(crate) fn check_links(
    file: &str,
    html: &str,
    lines: bool,
) -> Result<Vec<String>, ContentError> {
    let line = |at: usize| lines.then(|| html[..at].matches('\n').count() + 1);
    let at = |at: usize| line(at).map(|l| format!(":{l}")).unwrap_or_default();
    for (offset, url) in html_scan::literal_hrefs(html) {
        if let Some(why) = html_scan::refused_href(&url) {
            return Err(ContentError::Link {
                file: file.to_string(),
                line: line(offset),
                url,
                why,
            });
        }
    }
    Ok(html_scan::scripts(html)
        .into_iter()
        .map(|(offset, what)| {
            format!(
                "{file}{}: {what} in the HTML: mail clients strip scripts and event handlers, so it does nothing but look like an attack to spam filters",
                at(offset)
            )
        })
        .collect())
}
