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
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
