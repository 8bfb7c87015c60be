//! Every `mailsplit …` line in a code block of the README or of `docs/` is
//! parsed by the real argument parser, so no page can name a command or a
//! flag that does not exist. Placeholders and alternatives belong in the
//! line's `#` comment, where a reader sees them and the parser does not.

use std::path::{Path, PathBuf};

use clap::Parser;

use super::args::Cli;

/// The markdown files checked: the README and every page under `docs/`.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/ is readable");
    let mut found: Vec<PathBuf> = docs
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    found.sort();
    pages.extend(found);
    pages
}

/// Fenced blocks in these languages hold commands; others (diagrams,
/// `master.cf`, HTML) are not shell.
const SHELL: [&str; 4] = ["sh", "shell", "bash", "console"];

/// The command lines of a page's shell code blocks (continuations
/// joined), with the line number each starts on.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<bool> = None;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(SHELL.contains(&info.trim())),
            };
            continue;
        }
        if fence != Some(true) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        let body = line.trim_end();
        if let Some(cut) = body.strip_suffix('\\') {
            joined.push_str(cut);
            joined.push(' ');
            pending = Some((start, joined));
        } else {
            joined.push_str(body);
            out.push((start, joined));
        }
    }
    out
}

/// Shell words of one command, quotes removed, up to the first comment,
/// pipe, list operator or redirection outside quotes.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut has_word = false;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                has_word = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                    has_word = true;
                }
            }
            (None, '#') if !has_word => break,
            (None, '|' | ';' | '&' | '<' | '>') => break,
            (None, c) if c.is_whitespace() => {
                if has_word {
                    words.push(std::mem::take(&mut word));
                    has_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                has_word = true;
            }
        }
    }
    if has_word {
        words.push(word);
    }
    words
}

/// The arguments of a `mailsplit` command on this line, if it runs one
/// (after any `VAR=value` assignments).
fn mailsplit_args(line: &str) -> Option<Vec<String>> {
    let line = line.trim_start().trim_start_matches("$ ");
    let words = shell_words(line);
    let first = words.iter().position(|w| !is_assignment(w))?;
    (words[first] == "mailsplit").then(|| words[first..].to_vec())
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

#[test]
fn every_documented_command_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).expect("a documentation page is readable");
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for (line_no, line) in code_lines(&text) {
            let Some(args) = mailsplit_args(&line) else {
                continue;
            };
            checked += 1;
            if let Err(e) = Cli::try_parse_from(&args) {
                use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
                if !matches!(e.kind(), DisplayHelp | DisplayVersion) {
                    let why = e.to_string();
                    let why = why.lines().next().unwrap_or_default().to_owned();
                    wrong.push(format!("{name}:{line_no}: {line}\n    {why}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "documented commands the parser refuses:\n{}",
        wrong.join("\n")
    );
    assert!(
        checked >= 40,
        "only {checked} documented commands found: is the extraction broken?"
    );
}

#[test]
fn the_extraction_reads_shell_as_a_reader_does() {
    let page = "text\n```\nmailsplit enqueue <campaign>   diagram\n```\n```sh\nmailsplit campaign create a --list l \\\n    --subject \"Hi {{ name }}\" --from x@y # [--priority N]\nFOO=1 mailsplit status --json | jq .\nmailsplit bounce < r.eml\necho mailsplit\n```\nmailsplit not-in-a-block\n";
    let lines = code_lines(page);
    let args: Vec<Vec<String>> = lines
        .iter()
        .filter_map(|(_, l)| mailsplit_args(l))
        .collect();
    assert_eq!(
        args,
        vec![
            vec![
                "mailsplit",
                "campaign",
                "create",
                "a",
                "--list",
                "l",
                "--subject",
                "Hi {{ name }}",
                "--from",
                "x@y"
            ],
            vec!["mailsplit", "status", "--json"],
            vec!["mailsplit", "bounce"],
        ]
    );
    assert_eq!(lines[0].0, 6, "a joined line is reported where it starts");
    assert!(Cli::try_parse_from(["mailsplit", "campaign", "frobnicate"]).is_err());
    assert!(Cli::try_parse_from(["mailsplit", "status", "--jsn"]).is_err());
}
