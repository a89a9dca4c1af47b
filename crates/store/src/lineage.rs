//! Lineage: how an artifact was made (the jobs upstream of it, down to root inputs), the whole
//! project graph, and what in the working tree no longer matches what was recorded.
//!
//! An artifact's producer is the most recent job that wrote that content; a root input is content
//! no recorded job produced. Walks are breadth-first over indexed lookups, with visited sets so
//! a job that reads and writes the same content cannot loop.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use crate::error::{Result, StoreError};
use crate::model::{argv_from_blob, ContentHash};
use crate::query::{hash_from, Store};

/// A job as lineage shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub job_id: i64,
    pub name: Option<String>,
    #[serde(serialize_with = "crate::model::ser_argv")]
    pub argv: Vec<std::ffi::OsString>,
    pub cwd: String,
    pub started_ns: i64,
    pub ended_ns: Option<i64>,
    /// running | exited | signaled | failed_to_start | ended (seen by the mount, exit status unknown)
    pub status: String,
    pub exit_code: Option<i32>,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
    pub host: Option<String>,
    /// How it was observed: preload, ptrace, mount, gateway.
    pub backend: String,
    pub inputs: Vec<Edge>,
    pub outputs: Vec<Edge>,
}

impl Step {
    /// Whether the job read or wrote S3 objects (through the gateway).
    pub fn uses_s3(&self) -> bool {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .any(|e| e.path.starts_with("s3://"))
    }
}

/// One file of a step, with the job that produced its content (for inputs), if any.
#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    pub path: String,
    pub hash: Option<ContentHash>,
    pub producer: Option<i64>,
}

/// How one artifact was made: the steps in the order they started, and the root inputs.
#[derive(Debug, Clone, Serialize)]
pub struct Lineage {
    pub target: ContentHash,
    pub steps: Vec<Step>,
    pub roots: Vec<Edge>,
}

/// The whole project's graph: every step, in the order they started.
#[derive(Debug, Clone, Serialize)]
pub struct Dag {
    pub steps: Vec<Step>,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Store {
    /// The artifact recorded last at `path` (as an output, else as an input).
    pub fn artifact_at(&self, path: &Path) -> Result<ContentHash> {
        let bytes = path.as_os_str().as_bytes();
        let found = self
            .conn
            .prepare_cached(
                "SELECT a.blake3, a.sha256, a.size FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.path = ?1 AND f.role != 'temp'
                 ORDER BY f.role = 'output' DESC, f.id DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row([bytes], |r| {
                    Ok(ContentHash {
                        blake3: r.get(0)?,
                        sha256: r.get(1)?,
                        size: r.get::<_, i64>(2)? as u64,
                    })
                })
                .optional()
            })
            .map_err(|e| self.err(e))?;
        found.ok_or_else(|| StoreError::UnknownPath {
            path: path.to_owned(),
        })
    }

    /// The most recent job that wrote `blake3`, if any.
    fn producer(&self, blake3: &str) -> rusqlite::Result<Option<i64>> {
        self.conn
            .prepare_cached(
                "SELECT f.job_id FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE a.blake3 = ?1 AND f.role = 'output' ORDER BY f.job_id DESC LIMIT 1",
            )?
            .query_row([blake3], |r| r.get(0))
            .optional()
    }

    fn step(&self, job_id: i64) -> rusqlite::Result<Step> {
        let mut step = self
            .conn
            .prepare_cached(
                "SELECT name, argv, cwd, started_ns, ended_ns, status, exit_code, git_commit, git_dirty, host,
                        backend
                 FROM jobs WHERE id = ?1",
            )?
            .query_row([job_id], |r| {
                Ok(Step {
                    job_id,
                    name: r.get(0)?,
                    argv: r
                        .get_ref(1)?
                        .as_bytes()
                        .map(argv_from_blob)
                        .unwrap_or_default(),
                    cwd: lossy(r.get_ref(2)?.as_bytes().unwrap_or_default()),
                    started_ns: r.get(3)?,
                    ended_ns: r.get(4)?,
                    status: r.get(5)?,
                    exit_code: r.get(6)?,
                    git_commit: r.get(7)?,
                    git_dirty: r.get(8)?,
                    host: r.get(9)?,
                    backend: r.get(10)?,
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                })
            })?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT f.role, f.path, a.blake3, a.sha256, a.size FROM job_files f
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             WHERE f.job_id = ?1 AND f.role != 'temp' ORDER BY f.path",
        )?;
        let rows = stmt.query_map([job_id], |r| {
            let hash = hash_from(r.get(2)?, r.get(3)?, r.get(4)?);
            Ok((
                r.get::<_, String>(0)?,
                Edge {
                    path: lossy(r.get_ref(1)?.as_bytes().unwrap_or_default()),
                    hash,
                    producer: None,
                },
            ))
        })?;
        for row in rows {
            let (role, mut edge) = row?;
            if role == "input" {
                edge.producer = match &edge.hash {
                    // The producer must have started before this job read the content.
                    Some(h) => self
                        .conn
                        .prepare_cached(
                            // Started before this job: ids are not enough, since the mount
                            // records a job when its process ends, after jobs that began later.
                            "SELECT f.job_id FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                             JOIN jobs j ON j.id = f.job_id
                             WHERE a.blake3 = ?1 AND f.role = 'output' AND f.job_id != ?2
                               AND j.started_ns < ?3
                             ORDER BY j.started_ns DESC LIMIT 1",
                        )?
                        .query_row(params![h.blake3, job_id, step.started_ns], |r| r.get(0))
                        .optional()?,
                    None => None,
                };
                step.inputs.push(edge);
            } else {
                step.outputs.push(edge);
            }
        }
        Ok(step)
    }

    /// The jobs upstream of `target`, in the order they started, and the root inputs they start from.
    pub fn lineage(&self, target: &ContentHash) -> Result<Lineage> {
        let walk = || -> rusqlite::Result<Lineage> {
            let mut steps: BTreeMap<i64, Step> = BTreeMap::new();
            let mut roots: BTreeMap<String, Edge> = BTreeMap::new();
            let mut seen_jobs = HashSet::new();
            let mut queue = VecDeque::new();
            if let Some(job) = self.producer(&target.blake3)? {
                queue.push_back(job);
            }
            while let Some(job) = queue.pop_front() {
                if !seen_jobs.insert(job) {
                    continue;
                }
                let step = self.step(job)?;
                for input in &step.inputs {
                    match input.producer {
                        Some(p) => queue.push_back(p),
                        None => {
                            let key = format!(
                                "{}\0{}",
                                input.path,
                                input.hash.as_ref().map(|h| h.blake3.as_str()).unwrap_or("")
                            );
                            roots.entry(key).or_insert_with(|| input.clone());
                        }
                    }
                }
                steps.insert(job, step);
            }
            // In the order they ran (the mount records a job when it ends, so ids can be out
            // of order).
            let mut steps: Vec<Step> = steps.into_values().collect();
            steps.sort_by_key(|s| (s.started_ns, s.job_id));
            Ok(Lineage {
                target: target.clone(),
                steps,
                roots: roots.into_values().collect(),
            })
        };
        walk().map_err(|e| self.err(e))
    }

    /// Every job of the project, in the order they started, with the producers of their inputs.
    pub fn dag(&self) -> Result<Dag> {
        let walk = || -> rusqlite::Result<Dag> {
            let ids: Vec<i64> = self
                .conn
                .prepare(
                    "SELECT id FROM jobs WHERE status != 'failed_to_start' ORDER BY started_ns, id",
                )?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let steps = ids
                .into_iter()
                .map(|id| self.step(id))
                .collect::<rusqlite::Result<_>>()?;
            Ok(Dag { steps })
        };
        walk().map_err(|e| self.err(e))
    }

    /// The latest recorded content of every file path the store knows, for `roar status`.
    pub fn tracked_files(&self) -> Result<Vec<(String, Option<ContentHash>, String)>> {
        let walk = || -> rusqlite::Result<Vec<(String, Option<ContentHash>, String)>> {
            let mut stmt = self.conn.prepare(
                "SELECT f.path, a.blake3, a.sha256, a.size, f.role FROM job_files f
                 LEFT JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.id IN (SELECT max(id) FROM job_files WHERE kind = 'file' AND role != 'temp' GROUP BY path)
                 ORDER BY f.path",
            )?;
            let rows = stmt.query_map([], |r| {
                let hash = hash_from(r.get(1)?, r.get(2)?, r.get(3)?);
                Ok((
                    lossy(r.get_ref(0)?.as_bytes().unwrap_or_default()),
                    hash,
                    r.get(4)?,
                ))
            })?;
            rows.collect()
        };
        walk().map_err(|e| self.err(e))
    }
}
