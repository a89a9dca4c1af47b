//! roar's lineage store: the SQLite schema and its migrations, the single writer thread, content
//! hashing with its cache, secret redaction, and the queries the CLI answers from.
//!
//! Every producer (tracers, the mount, the gateway) hands finished [`JobRecord`]s to a [`Writer`];
//! nothing else writes to the database.

pub mod audit;
mod committer;
mod db;
pub mod environment;
mod error;
pub mod hash;
mod held;
pub mod ignore;
pub mod job_bytes;
mod lineage;
mod model;
pub mod objects;
pub mod private;
mod project;
mod query;
pub mod quote;
pub mod redact;
mod runs;
mod status;
mod steps;
mod writer;

pub use committer::Committer;
pub use db::{open, SCHEMA_VERSION};
pub use environment::{Environment, EnvironmentDetail, Gpu, Package, Runtime};
pub use error::{error_chain, Result, StoreError};
pub use held::DbStats;
pub use lineage::{node_name, Dag, Edge, Lineage, Outputs, Step, Version};
pub use model::{
    argv_from_blob, argv_to_blob, now_ns, recorder_id, CacheEntry, ContentHash, Distributed,
    FileRecord, FileStat, GitState, JobRecord, Made, Ops, Outcome, PathUse, ProcessRecord,
    Redirect, Role, S3Object, StepContent, StepDetail, StepEdge, StepFile, StepRecord, Stream,
};
pub use project::{Project, CONFIG_NAME, DB_NAME, DEFAULT_CONFIG, DIR_NAME};
pub use query::{ArtifactDetail, FileRow, JobDetail, JobSummary, PathDetail, Store, Use};
pub use quote::{shell_join, shell_quote, shown};
pub use runs::{RunDetail, RunFile, RunJob};
pub use status::{Cause, Change, Now, StaleJob, StatusPlan, StatusReport, Unfinished};
pub use writer::{
    checkpoint, checkpoint_due, import as import_jobs, Begun, Checkpoints, FileChunk, JobStream,
    OpeningWriter, Writer, WAL_LIMIT,
};

/// Helpers for tests that need databases of an older schema.
#[doc(hidden)]
pub mod testing {
    use std::path::Path;

    /// Creates a database at `path` migrated only up to `version`.
    pub fn create_at_version(path: &Path, version: usize) -> crate::Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open(path).map_err(|e| crate::db::classify(path, e))?;
        crate::db::migrate(&conn, path, version)?;
        Ok(conn)
    }
}
