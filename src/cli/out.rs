//! What commands print: every line for the user goes to stdout through
//! here, never through `println!` (which panics when the reader is gone).
//! A closed pipe (`mailsplit status | head -1`) comes back as an
//! [`OutputError`] whose exit kind is "quiet": the command stops, and the
//! process exits 0 saying nothing, as ripgrep does.

use std::io::{self, Write};

/// stdout could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output")]
pub struct OutputError(#[source] io::Error);

impl OutputError {
    /// The reader went away (EPIPE): nobody wants the rest.
    pub fn closed(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

/// Write bytes to stdout as they are (a MIME message, a rendered table).
pub fn bytes(data: &[u8]) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_all(data)
        .and_then(|()| out.flush())
        .map_err(OutputError)
}

/// Write one formatted line to stdout; use [`outln!`].
pub fn line(args: std::fmt::Arguments<'_>) -> Result<(), OutputError> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(OutputError)
}

/// A line on stderr that may be lost: a closed stderr never stops the
/// program (unlike `eprintln!`, which panics).
pub fn error_line(text: &str) {
    let _ = writeln!(io::stderr(), "{text}");
}

/// `println!` for command output: `outln!("…", x)?`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
