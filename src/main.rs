//! Entry point: parse the command line, run it, print any error with its
//! whole cause chain, and exit with the documented code (0 success,
//! 1 runtime failure, 2 usage error).

use std::process::ExitCode;

use mailsplit::cli::{fail, parse, run};

/// mimalloc instead of glibc malloc: a worker allocates per message (MIME
/// parts, SMTP buffers) from many threads, and glibc's arena locks and
/// consolidation took a large share of its CPU time in `perf`. Built with
/// `no_thp`: otherwise mimalloc asks for transparent huge pages on its
/// arenas, and each thread's first touches fault in huge pages, nearly
/// doubling a worker's peak RSS at the same speed (BENCHMARKS.md,
/// "Measurements behind the code's choices").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Whatever this process creates (the SQLite database and its -wal and
    // -shm files, hold recipients' personal data) is its owner's alone.
    // SAFETY: umask only replaces the process's file-creation mask.
    unsafe { libc::umask(0o077) };
    // glibc's malloc still serves the C libraries (libsqlite3, libpq and
    // its TLS). It gives each thread that first allocates an arena of its
    // own, and SQLite runs on whichever of tokio's blocking threads holds
    // the connection, so its pages spread over many arenas. One arena
    // lowers a SQLite worker's peak RSS at the same rate (BENCHMARKS.md):
    // the connection is used by one thread at a time, so there is no lock
    // to contend. Before any thread exists.
    // SAFETY: mallopt only changes a malloc tunable.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    // SQLite opens an in-memory b-tree for each `IN (…)` list and each
    // `RETURNING`, with a page cache of ~90 KB that it frees when the
    // statement ends. With glibc's default trim threshold (128 KB) that
    // free shrank the heap and the next statement grew it again: page
    // faults on every claim and every batch of outcomes, 5 % of a SQLite
    // worker's CPU (BENCHMARKS.md, "A worker's CPU, cut by cut"). Freed
    // memory up to this much stays in the process for the next statement.
    // SAFETY: as above.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20) };
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    mailsplit::logging::init();
    // Errors print their whole cause chain, redacted; a closed stdout
    // ends quietly with 0.
    run(cli).unwrap_or_else(fail)
}
