//! What is wrong with a template the user wrote, said so they can fix it:
//! the file and line, an unknown variable named with the ones there are,
//! an unknown filter with the nearest built-in one.

use std::collections::BTreeSet;

use minijinja::Environment;

use super::{RenderError, GLOBALS, VARIABLES};

/// A template the user wrote that cannot be used, with where and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{file}{}: {problem}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct TemplateProblem {
    /// The file (or `--subject`) the template came from.
    pub file: String,
    pub line: Option<usize>,
    pub problem: String,
}

/// A render error as a problem with the file the template came from.
pub(super) fn render_problem(file: &str, e: &RenderError) -> TemplateProblem {
    match e {
        RenderError::Template(e) => problem(file, e),
        other => TemplateProblem {
            file: file.to_string(),
            line: None,
            problem: format!("{other} (for the sample recipient)"),
        },
    }
}

/// Parse one template into `env` and check that it names only
/// [`VARIABLES`] at the top level.
pub(super) fn add(
    env: &mut Environment<'static>,
    key: &str,
    file: &str,
    source: &str,
    extra: &[&str],
) -> Result<(), TemplateProblem> {
    env.add_template_owned(key.to_string(), source.to_string())
        .map_err(|e| problem(file, &e))?;
    let template = env.get_template(key).map_err(|e| problem(file, &e))?;
    let unknown: BTreeSet<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| {
            let v = v.as_str();
            !VARIABLES.contains(&v) && !GLOBALS.contains(&v) && !extra.contains(&v)
        })
        .collect();
    match unknown.first() {
        None => Ok(()),
        Some(name) => Err(TemplateProblem {
            file: file.to_string(),
            line: line_of(source, name),
            problem: format!(
                "unknown variable `{name}`; a template can use {} (extra CSV columns are attributes.COLUMN)",
                VARIABLES.join(", ")
            ),
        }),
    }
}

pub(super) fn problem(file: &str, e: &minijinja::Error) -> TemplateProblem {
    TemplateProblem {
        file: file.to_string(),
        line: e.line(),
        problem: describe(e),
    }
}

/// An engine error in one sentence: its kind, then what it adds (an
/// unknown filter said once, with the nearest built-in one).
pub(super) fn describe(e: &minijinja::Error) -> String {
    let unknown_filter = (e.kind() == minijinja::ErrorKind::UnknownFilter)
        .then(|| {
            e.detail()?
                .strip_prefix("filter ")?
                .strip_suffix(" is unknown")
        })
        .flatten();
    if let Some(name) = unknown_filter {
        return match nearest_filter(name) {
            Some(near) => format!("unknown filter `{name}`: did you mean `{near}`?"),
            None => format!(
                "unknown filter `{name}`: the filters are {}",
                BUILTIN_FILTERS.join(", ")
            ),
        };
    }
    match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    }
}

/// The engine's built-in filters (minijinja's `builtins` feature); a unit
/// test checks that each exists in the engine.
pub(super) const BUILTIN_FILTERS: [&str; 46] = [
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "chain",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "trim",
    "unique",
    "upper",
];

/// The built-in filter a typo most likely meant: at most two edits away.
pub(super) fn nearest_filter(name: &str) -> Option<&'static str> {
    BUILTIN_FILTERS
        .iter()
        .map(|f| (strsim::damerau_levenshtein(name, f), *f))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f)
}

/// The first line on which `word` appears as a whole word.
pub(super) fn line_of(source: &str, word: &str) -> Option<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    source
        .lines()
        .position(|line| {
            line.match_indices(word).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + word.len()..].chars().next();
                !before.is_some_and(ident) && !after.is_some_and(ident)
            })
        })
        .map(|i| i + 1)
}
