//! Errors of the store crate.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no roar project here (looked in {start} and its parents); run `roar init`")]
    NoProject { start: PathBuf },
    #[error("{path} is not a roar database")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path} has schema version {found}, newer than this roar understands ({supported}); upgrade roar, the database was left untouched")]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    /// Found by a long-lived writer under the write lock: a newer roar migrated the store since
    /// it was opened, and nothing was written.
    #[error("the schema of {path} changed to version {found} while this roar had it open; nothing was written")]
    SchemaChanged { path: PathBuf, found: i64 },
    #[error("store {path} is read-only")]
    ReadOnly {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database error on {path}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no artifact has a hash starting with {prefix}")]
    UnknownHash { prefix: String },
    #[error("hash prefix {prefix} is ambiguous; candidates: {}", candidates.join(", "))]
    AmbiguousHash {
        prefix: String,
        candidates: Vec<String>,
    },
    #[error("no job {id}")]
    UnknownJob { id: i64 },
    #[error("{path} was never recorded by roar")]
    UnknownPath { path: PathBuf },
    #[error("the store's writer thread has stopped")]
    WriterGone,
    /// Reaching, reading or writing the team store (PostgreSQL): the text says which and why.
    #[error("{0}")]
    Team(String),
    /// The team store answered, and refused (no right to read or write it, a constraint): the
    /// text gives the server's reason and what to do. Not an outage: no older copy answers.
    #[error("{0}")]
    TeamRefused(String),
}

impl StoreError {
    /// A SQLite error on the store at `path`, as the store error a user can act on (corrupt,
    /// read-only, busy...).
    pub fn sqlite(path: &std::path::Path, e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        let path: PathBuf = path.to_owned();
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => {
                StoreError::Corrupt { path, source: e }
            }
            Some(ErrorCode::ReadOnly)
            | Some(ErrorCode::CannotOpen)
            | Some(ErrorCode::PermissionDenied)
                if !dir_writable(&path) =>
            {
                StoreError::ReadOnly { path, source: e }
            }
            _ => StoreError::Sqlite { path, source: e },
        }
    }

    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// An error with its causes on one line, `a: b: c`, as roar prints errors; a cause whose text
/// the line already holds is not repeated (postgres and hyper errors repeat theirs).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let more = c.to_string();
        if !s.contains(&more) {
            s.push_str(": ");
            s.push_str(&more);
        }
        cur = c.source();
    }
    s
}

/// Whether the directory holding `db` takes a new file.
fn dir_writable(db: &std::path::Path) -> bool {
    // Root ignores mode bits, so the only honest test is to try: a probe file is created and
    // removed next to the database (this runs only on the error path).
    let dir = db.parent().unwrap_or(std::path::Path::new("."));
    let probe = dir.join(format!(".roar-write-probe-{}", std::process::id()));
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .is_ok();
    if created {
        let _ = std::fs::remove_file(&probe);
    }
    let db_writable = std::fs::OpenOptions::new().append(true).open(db).is_ok() || !db.exists();
    created && db_writable
}
