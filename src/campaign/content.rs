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
    let check = |body: Option<[(&str, &str); 2]>| {
        Compiled::with_vars(
            &Sources {
                subject: ("--subject", subject),
                body,
            },
            campaign,
            extra,
        )
    };
    let convert = |file: &str| {
        let file = file.to_string();
        move |problem| ContentError::Convert { file, problem }
    };
    let mut warnings = Vec::new();
    let (kind, html, text) = match content {
        ContentSource::Template(name) => {
            templates::check(name)?;
            check(None)?;
            (ContentKind::Builtin, String::new(), String::new())
        }
        ContentSource::Html { html, text } => {
            let (html_file, html) = read_file(html)?;
            let text = text.as_deref().map(read_file).transpose()?;
            // The user's own files first: line numbers are theirs.
            let own_text = text.as_ref().map_or(("", ""), |(f, t)| (f, t));
            check(Some([(&html_file, &html), own_text]))?;
            warnings = check_links(&html_file, &html, true)?;
            let derived = match text {
                Some((_, text)) => text,
                None => source::html_to_text(&html).map_err(convert(&html_file))?,
            };
            let inlined = source::inline_css(&html).map_err(convert(&html_file))?;
            (ContentKind::Html, inlined, derived)
        }
        ContentSource::Markdown(path) => {
            let (file, markdown) = read_file(path)?;
            check(Some([(&file, &markdown), ("", "")]))?;
            let html = source::markdown_to_html(&markdown);
            // Lines of the converted HTML are not the file's.
            warnings = check_links(&file, &html, false)?;
            let text = source::html_to_text(&html).map_err(convert(&file))?;
            let html = source::inline_css(&html).map_err(convert(&file))?;
            (ContentKind::Markdown, html, text)
        }
    };
    let body = (kind != ContentKind::Builtin)
        .then_some([("HTML part", html.as_str()), ("text part", text.as_str())]);
    // The converted parts compile too (a converter that broke a tag).
    if body.is_some() {
        check(body)?;
    }
    let label = match content {
        ContentSource::Template(name) => name.clone(),
        _ => kind.to_string(),
    };
    Ok(Prepared {
        kind,
        subject: subject.to_string(),
        html,
        text,
        label,
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
