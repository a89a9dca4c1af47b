//! A writer without a thread of its own, for a process that serves each client on a thread that
//! waits for the answer anyway (the resident recorder: one thread per `roar run`). Each call
//! commits on its caller's thread, one caller at a time, and returns once committed.
//!
//! [`crate::Writer`] hands every message to its thread and waits for the reply: two wake-ups
//! (~0.1 ms on a two-vCPU VM) on the path `roar run` waits on, for batching this process does not
//! need (a run's job is one transaction; nothing here is fsync'd per commit, so commits of runs
//! at once gain little from sharing one).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::Connection;

use crate::db;
use crate::error::{Result, StoreError};
use crate::model::{CacheEntry, JobRecord};
use crate::redact::Policy;
use crate::writer::{self, Checkpoints};

pub struct Committer {
    path: PathBuf,
    /// The redaction rules of config.toml when the committer opened: every job is redacted on
    /// its way in, before anything reaches the database or its WAL.
    policy: Policy,
    conn: Mutex<Connection>,
}

impl Committer {
    /// Opens the store at `path` for writing, its WAL checkpointed as `checkpoints` says.
    pub fn open(path: &Path, checkpoints: Checkpoints) -> Result<Committer> {
        Ok(Committer {
            conn: Mutex::new(writer::connect(path, checkpoints)?),
            policy: Policy::for_config(&path.with_file_name(crate::project::CONFIG_NAME))
                .remembering(),
            path: path.to_owned(),
        })
    }

    /// Writes `job`'s row as `running`, recorded by `recorder` (a [`crate::recorder_id`]: the
    /// row reads `killed` once that process is gone without the job recorded), and returns its
    /// id once committed.
    pub fn begin_job_for(&self, job: &JobRecord, recorder: String) -> Result<i64> {
        let mut header = writer::header(job);
        self.policy.job(&mut header);
        self.transact(|tx| writer::insert_job(tx, &header, None, None, Some(&recorder)))
    }

    /// Records `job` with the hash-cache entries its hashing produced, in one transaction: into
    /// the row [`Committer::begin_job_for`] made if `begun` names it, else into a new row.
    /// Returns the job's id once committed.
    pub fn record(
        &self,
        begun: Option<i64>,
        cache: &[CacheEntry],
        mut job: JobRecord,
    ) -> Result<i64> {
        self.policy.job(&mut job);
        self.transact(|tx| {
            writer::insert_cache(tx, cache)?;
            writer::insert_job(tx, &job, None, begun, None)
        })
    }

    /// Runs `f` in a transaction that holds the store's write lock and commits it, if the
    /// store's schema is still the one this roar writes: read under the lock, so a newer roar
    /// cannot migrate the store between the check and the write. The transaction's statements
    /// are prepared once (rusqlite's `Transaction` prepares `BEGIN` and `COMMIT` anew each time).
    fn transact<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
        run("BEGIN IMMEDIATE").map_err(|e| db::classify(&self.path, e))?;
        let outcome = (|| {
            let found: i64 = conn
                .prepare_cached("PRAGMA user_version")?
                .query_row([], |r| r.get(0))?;
            if found != db::SCHEMA_VERSION {
                return Ok(Err(StoreError::SchemaChanged {
                    path: self.path.clone(),
                    found,
                }));
            }
            let value = f(&conn)?;
            run("COMMIT")?;
            Ok(Ok(value))
        })();
        match outcome {
            Ok(Ok(value)) => Ok(value),
            failed => {
                // Nothing of a failed transaction stays (a failed COMMIT leaves it open).
                if !conn.is_autocommit() {
                    let _ = run("ROLLBACK");
                }
                failed.map_err(|e| db::classify(&self.path, e))?
            }
        }
    }
}
