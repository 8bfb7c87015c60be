//! What a database URL names, before anything connects: the backend, a
//! SQLite file's path and how it may be opened (created owner-only, read
//! and written, or read only), PostgreSQL's link checks, and the file a
//! worker watches for replacement.

use super::{Result, StoreError};

/// Which backend a URL names, checked before anything connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Check a database URL without connecting.
pub fn backend_of(url: &str) -> Result<Backend> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(StoreError::BadUrl(crate::redact::url(url)))
    }
}

/// `sqlite://relative.db`, `sqlite:///absolute.db` and `sqlite:file.db` all
/// name a file path.
pub(super) fn sqlite_path(url: &str) -> &str {
    let rest = url.trim_start_matches("sqlite:");
    rest.strip_prefix("//").unwrap_or(rest)
}

/// How a command uses the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `migrate`: a missing SQLite file is created, readable by its owner
    /// only (it holds recipients' personal data; SQLite gives its -wal and
    /// -shm files the database file's mode).
    Create,
    /// Read and write an existing database; never create one.
    ReadWrite,
    /// Commands that only read (`status`, `campaign list`, `preview`, `rate
    /// list`): SQLite opened read-only, PostgreSQL sessions read-only.
    ReadOnly,
}

/// Mode of a SQLite file `migrate` creates.
pub(super) const SQLITE_FILE_MODE: u32 = 0o600;

/// Whether SQLite gets `path` as it is: an in-memory database or the
/// user's own `file:` URI, which name no file to check or create.
pub(super) fn sqlite_special(path: &str) -> bool {
    path == ":memory:" || path.is_empty() || path.starts_with("file:")
}

/// What SQLite opens for `path` with `access`: the path itself (created
/// first, owner-only, if missing) or a `file:` URI whose `mode=` forbids
/// creating it (`rw`) or writing it (`ro`).
pub(super) fn sqlite_target(path: &str, access: Access) -> Result<String> {
    if sqlite_special(path) {
        return Ok(path.to_string());
    }
    if access == Access::Create {
        use std::os::unix::fs::OpenOptionsExt;
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(SQLITE_FILE_MODE)
            .open(path);
        return match created {
            Ok(_) => Ok(path.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(path.to_string()),
            Err(source) => Err(StoreError::CreateFile {
                path: path.to_string(),
                source,
            }),
        };
    }
    if !std::path::Path::new(path).exists() {
        let shown = std::path::absolute(path)
            .map_or_else(|_| path.to_string(), |p| p.display().to_string());
        return Err(StoreError::NoDatabaseFile(shown));
    }
    // In a URI '%', '?' and '#' are syntax; everything else goes as is.
    let escaped = path
        .replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23");
    let mode = if access == Access::ReadOnly {
        "ro"
    } else {
        "rw"
    };
    Ok(format!("file:{escaped}?mode={mode}"))
}

/// The path and mode of a SQLite database file that users other than its
/// owner may read: `migrate` says so (it never changes an existing file's
/// mode by itself).
pub fn exposed_sqlite_file(url: &str) -> Option<(String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let path = sqlite_path(url);
    if backend_of(url).ok()? != Backend::Sqlite || sqlite_special(path) {
        return None;
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| (path.to_string(), mode))
}

/// The file behind a SQLite database, as it was when the process opened
/// it: a worker compares it with what the path names now, and stops when
/// the file was deleted or replaced (its connection would go on writing
/// into the old, unlinked file, and `status` would read another).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbFile {
    path: std::path::PathBuf,
    dev: u64,
    ino: u64,
}

impl DbFile {
    /// The file a SQLite URL names now; `None` for PostgreSQL (or a file
    /// that cannot be looked at, which nothing then checks).
    pub fn of(url: &str) -> Option<DbFile> {
        use std::os::unix::fs::MetadataExt;
        if backend_of(url).ok()? != Backend::Sqlite {
            return None;
        }
        let path = std::path::PathBuf::from(sqlite_path(url));
        let meta = std::fs::metadata(&path).ok()?;
        Some(DbFile {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Whether the path still names the same file (device and inode).
    pub fn check(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let what = match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "deleted",
            // Unreadable for a moment (permissions being changed?): not
            // evidence of a replacement.
            Err(_) => return Ok(()),
            Ok(m) if (m.dev(), m.ino()) != (self.dev, self.ino) => "replaced",
            Ok(_) => return Ok(()),
        };
        Err(StoreError::FileReplaced {
            path: self.path.display().to_string(),
            what,
        })
    }
}

/// libpq's checks of the link, for those the URL does not set: without
/// them, connecting waits as long as the server stays silent, and a
/// connection whose peer vanished (a cable pulled, a host gone) is only
/// found dead by the kernel's retransmission limit, many minutes on. A
/// connection attempt gives up after `connect_timeout`; an idle one is
/// probed by keepalives; data left unacknowledged fails the connection
/// after `tcp_user_timeout`.
pub(super) const LINK_CHECKS: [(&str, &str); 6] = [
    ("connect_timeout", "10"),
    ("keepalives", "1"),
    ("keepalives_idle", "10"),
    ("keepalives_interval", "5"),
    ("keepalives_count", "3"),
    ("tcp_user_timeout", "30000"),
];

/// `url` with the [`LINK_CHECKS`] it does not set already.
pub(super) fn with_link_checks(url: &str) -> String {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let set: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split('=').next())
        .collect();
    let mut out = url.to_string();
    for (key, value) in LINK_CHECKS {
        if set.contains(&key) {
            continue;
        }
        out.push(if out.contains('?') { '&' } else { '?' });
        out.push_str(key);
        out.push('=');
        out.push_str(value);
    }
    out
}
