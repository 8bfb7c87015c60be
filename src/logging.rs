//! The log: lines on stderr, filtered by `MAILSPLIT_LOG` (default `info`).
//!
//! Logging can never stop the program. A worker's stderr may be a pipe
//! whose reader went away (`mailsplit worker 2>&1 | head -c1`): every write
//! then fails, and tracing-subscriber's default answer to a failed write is
//! `eprintln!`, which panics on the same closed pipe, in whichever task
//! logged. So the writer drops what it cannot write and reports success,
//! and the subscriber's own error reporting is off.
//!
//! The deploy watcher (see [`crate::shutdown`]) watches the executable's
//! directory. If the log file lives there too, `notify`'s own trace lines
//! about each change in that directory are writes to the log file, which
//! are changes in that directory: at `MAILSPLIT_LOG=trace` that loop wrote
//! 100 MB in 2 s. Its internals are therefore held at `warn` unless
//! `MAILSPLIT_LOG` names them.

use std::io::{IsTerminal, Write};

use tracing_subscriber::EnvFilter;

/// The environment variable holding the filter (`info`, `debug`,
/// `mailsplit=trace`, …).
pub const LOG_ENV: &str = "MAILSPLIT_LOG";
/// Crates whose trace lines describe the watched directory itself.
const QUIET_UNLESS_NAMED: &[&str] = &["notify"];

/// stderr, with every write error dropped (see the module documentation).
struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// The filter for `spec` (the value of [`LOG_ENV`], if set).
fn filter(spec: Option<&str>) -> EnvFilter {
    let mut filter = spec
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    for target in QUIET_UNLESS_NAMED {
        if !spec.is_some_and(|s| s.contains(target)) {
            if let Ok(directive) = format!("{target}=warn").parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    filter
}

/// Install the global subscriber (once, at start-up).
pub fn init() {
    let spec = std::env::var(LOG_ENV).ok();
    tracing_subscriber::fmt()
        .with_env_filter(filter(spec.as_deref()))
        .with_writer(|| LossyStderr)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watcher_internals_stay_quiet_unless_named() {
        let directives = |spec| {
            filter(spec)
                .to_string()
                .split(',')
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let shown = directives(Some("trace"));
        assert!(shown.contains(&"notify=warn".to_string()), "{shown:?}");
        assert!(shown.contains(&"trace".to_string()), "{shown:?}");
        let named = directives(Some("notify=trace"));
        assert!(named.contains(&"notify=trace".to_string()), "{named:?}");
        assert!(!named.contains(&"notify=warn".to_string()), "{named:?}");
        assert!(filter(None).to_string().contains("info"));
        // A filter that does not parse falls back to info.
        assert!(filter(Some("=[")).to_string().contains("info"));
    }
}
