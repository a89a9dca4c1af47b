//! What the store holds: its tables' sizes (`roar db`), and for the object store the hashes
//! `roar gc` must keep, the oldest job still running (whose kept versions are recorded only when
//! it ends) and the S3 object versions already hashed.

use rusqlite::OptionalExtension;
use serde::Serialize;

use crate::error::Result;
use crate::query::Store;

/// The store's files' size and its tables' row counts (`roar db`).
#[derive(Debug, Clone, Serialize)]
pub struct DbStats {
    pub path: String,
    pub size_bytes: u64,
    pub schema_version: i64,
    pub jobs: i64,
    pub processes: i64,
    pub artifacts: i64,
    pub job_files: i64,
    pub s3_objects: i64,
    pub hash_cache: i64,
}

impl Store {
    /// What `roar db` shows of the store.
    pub fn stats(&self) -> Result<DbStats> {
        let count = |table: &str| -> Result<i64> {
            self.conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .map_err(|e| self.err(e))
        };
        let size_bytes = ["", "-wal"]
            .iter()
            .filter_map(|s| {
                let mut p = self.path.clone().into_os_string();
                p.push(s);
                std::fs::metadata(p).ok()
            })
            .map(|m| m.len())
            .sum();
        Ok(DbStats {
            path: self.path.to_string_lossy().into_owned(),
            size_bytes,
            schema_version: self
                .conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(|e| self.err(e))?,
            jobs: count("jobs")?,
            processes: count("processes")?,
            artifacts: count("artifacts")?,
            job_files: count("job_files")?,
            s3_objects: count("s3_objects")?,
            hash_cache: count("hash_cache")?,
        })
    }

    /// blake3 and size of an S3 object version (by ETag) recorded before, if any.
    pub fn s3_known(&self, bucket: &str, key: &str, etag: &str) -> Result<Option<(String, u64)>> {
        self.conn
            .prepare_cached(
                "SELECT a.blake3, a.size FROM s3_objects o JOIN artifacts a ON a.id = o.artifact_id
                 WHERE o.bucket = ?1 AND o.key = ?2 AND o.etag = ?3 ORDER BY o.id DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row([bucket, key, etag], |r| {
                    Ok((r.get(0)?, r.get::<_, i64>(1)? as u64))
                })
                .optional()
            })
            .map_err(|e| self.err(e))
    }

    /// The content hash of every file version job `id` read or wrote.
    pub fn job_hashes(&self, id: i64) -> Result<std::collections::HashSet<String>> {
        self.conn
            .prepare_cached(
                "SELECT a.blake3 FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.job_id = ?1",
            )
            .and_then(|mut s| {
                s.query_map([id], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<_>>()
            })
            .map_err(|e| self.err(e))
    }

    /// When the oldest job still running began (ns since the epoch), if any: its kept versions
    /// are recorded only when it ends (`roar gc` keeps every blob written since).
    pub fn running_since(&self) -> Result<Option<i64>> {
        let read = || -> rusqlite::Result<Option<i64>> {
            let mut st = self.conn.prepare(
                "SELECT started_ns, status, recorder, host FROM jobs WHERE status = 'running'",
            )?;
            let rows = st.query_map([], |r| {
                let status = crate::model::live_status(
                    r.get(1)?,
                    r.get(2)?,
                    r.get::<_, Option<String>>(3)?.as_deref(),
                );
                Ok((r.get::<_, i64>(0)?, status))
            })?;
            let mut oldest: Option<i64> = None;
            for row in rows {
                let (started, status) = row?;
                if status == "running" {
                    oldest = Some(oldest.map_or(started, |o| o.min(started)));
                }
            }
            Ok(oldest)
        };
        read().map_err(|e| self.err(e))
    }

    /// Every content hash the record holds (file versions and S3 objects alike): the versions
    /// `roar gc` never takes from the object store.
    pub fn recorded_hashes(&self) -> Result<std::collections::HashSet<String>> {
        self.conn
            .prepare("SELECT blake3 FROM artifacts")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<_>>()
            })
            .map_err(|e| self.err(e))
    }
}
