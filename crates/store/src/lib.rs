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
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    pub use crate::lineage::Walked;
    use crate::{FileRecord, JobRecord, Outcome};

    /// The seeded generator of the generated tests (xorshift64): the seed is `var`'s value when
    /// it is set, to replay a failure, else `default`; a failure message prints [`Rng::seed`].
    pub struct Rng {
        seed: u64,
        x: u64,
    }

    impl Rng {
        pub fn from_env(var: &str, default: u64) -> Rng {
            let seed = std::env::var(var)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default);
            Rng { seed, x: seed | 1 }
        }

        pub fn seed(&self) -> u64 {
            self.seed
        }

        /// A number below `n`.
        pub fn below(&mut self, n: usize) -> usize {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            (self.x % n as u64) as usize
        }
    }

    /// A job of `argv` in `cwd` that started at `started_ns`, ran a second and exited 0, with
    /// `files` and nothing else recorded: what tests that fill a store write.
    pub fn job(argv: &[&str], cwd: &str, started_ns: i64, files: Vec<FileRecord>) -> JobRecord {
        JobRecord {
            name: None,
            argv: argv.iter().map(OsString::from).collect(),
            cwd: PathBuf::from(cwd),
            started_ns,
            ended_ns: Some(started_ns + 1_000_000_000),
            outcome: Outcome::Exited(0),
            incomplete: false,
            backend: "test".into(),
            git: None,
            env: Default::default(),
            host: None,
            processes: vec![],
            steps: Vec::new(),
            files,
            environment: None,
            uid: None,
            dist: None,
        }
    }

    /// A file record of `role` at `path` holding `content` (read, or written and created).
    pub fn file(role: crate::Role, path: &str, content: &[u8]) -> FileRecord {
        FileRecord {
            role,
            path: PathBuf::from(path),
            hash: Some(crate::ContentHash {
                blake3: blake3::hash(content).to_hex().to_string(),
                sha256: None,
                size: content.len() as u64,
            }),
            before: None,
            ops: if role == crate::Role::Input {
                crate::Ops::READ
            } else {
                crate::Ops::WRITE | crate::Ops::CREATE
            },
            first_ns: None,
            last_ns: None,
            s3: None,
        }
    }

    /// A lineage walk as [`crate::Store::lineage_with`] reads it, on the store's connection
    /// alone or (`parallel`) with more connections for its wide levels, and whether it did.
    pub fn lineage_walk(
        store: &crate::Store,
        target: &crate::Version,
        outputs: crate::Outputs,
        parallel: bool,
    ) -> crate::Result<crate::lineage::Walked> {
        store
            .walk(target, outputs, parallel)
            .map_err(|e| store.err(e))
    }

    /// Creates a database at `path` migrated only up to `version`.
    pub fn create_at_version(path: &Path, version: usize) -> crate::Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open(path).map_err(|e| crate::db::classify(path, e))?;
        crate::db::migrate(&conn, path, version)?;
        Ok(conn)
    }
}
