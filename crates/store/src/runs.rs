//! Distributed runs: the jobs that share a group (model::Distributed), whatever machine recorded
//! them, read as one run: its ranks, hosts and files.

use std::collections::BTreeMap;

use rusqlite::params;
use serde::Serialize;

use crate::error::Result;
use crate::model::{ContentHash, Role};
use crate::query::{JobSummary, Store};

/// A distributed run as `roar show RUN` gives it.
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub group: String,
    /// Its jobs by rank (node-level jobs, without a rank, by node), then by start.
    pub jobs: Vec<RunJob>,
    pub hosts: Vec<String>,
    pub inputs: Vec<RunFile>,
    pub outputs: Vec<RunFile>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunJob {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub host: Option<String>,
}

/// A file version of the run, with the jobs that read (inputs) or wrote (outputs) it.
#[derive(Debug, Clone, Serialize)]
pub struct RunFile {
    pub path: String,
    pub hash: Option<ContentHash>,
    pub jobs: Vec<i64>,
}

impl Store {
    /// Whether some job belongs to the distributed run `group`.
    pub fn has_run(&self, group: &str) -> Result<bool> {
        self.conn
            .prepare_cached("SELECT 1 FROM jobs WHERE run_group = ?1")
            .and_then(|mut s| s.exists([group]))
            .map_err(|e| self.err(e))
    }

    /// The jobs of the distributed run `group` (ids), by rank, node and start.
    pub(crate) fn run_job_ids(&self, group: &str) -> rusqlite::Result<Vec<i64>> {
        self.conn
            .prepare_cached(
                "SELECT id FROM jobs WHERE run_group = ?1
                 ORDER BY rank IS NULL, rank, node_rank, started_ns, id",
            )?
            .query_map([group], |r| r.get(0))?
            .collect()
    }

    /// The distributed run `group`: every job of it, the hosts, and the files its jobs read and
    /// wrote (each version once, with the jobs that used it).
    pub fn run(&self, group: &str) -> Result<RunDetail> {
        let ids = self.run_job_ids(group).map_err(|e| self.err(e))?;
        let mut jobs = Vec::with_capacity(ids.len());
        let mut hosts = std::collections::BTreeSet::new();
        let mut files: BTreeMap<(bool, String, String), RunFile> = BTreeMap::new();
        for id in ids {
            let detail = self.job(id)?;
            if let Some(h) = &detail.host {
                hosts.insert(h.clone());
            }
            for f in detail.files.iter().filter(|f| f.role != Role::Temp) {
                let content = f
                    .hash
                    .as_ref()
                    .map(|h| h.blake3.clone())
                    .unwrap_or_default();
                files
                    .entry((f.role == Role::Input, f.path.clone(), content))
                    .or_insert_with(|| RunFile {
                        path: f.path.clone(),
                        hash: f.hash.clone(),
                        jobs: Vec::new(),
                    })
                    .jobs
                    .push(id);
            }
            jobs.push(RunJob {
                summary: detail.summary,
                host: detail.host,
            });
        }
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for ((input, _, _), f) in files {
            if input {
                inputs.push(f);
            } else {
                outputs.push(f);
            }
        }
        Ok(RunDetail {
            group: group.to_owned(),
            jobs,
            hosts: hosts.into_iter().collect(),
            inputs,
            outputs,
        })
    }

    /// The other jobs of job `job_id`'s distributed run, if it is in one.
    pub(crate) fn run_peers(&self, job_id: i64) -> rusqlite::Result<Vec<i64>> {
        self.conn
            .prepare_cached(
                "SELECT p.id FROM jobs j JOIN jobs p ON p.run_group = j.run_group
                 WHERE j.id = ?1 AND p.id != ?1 AND p.status != 'failed_to_start'
                 ORDER BY p.id",
            )?
            .query_map(params![job_id], |r| r.get(0))?
            .collect()
    }
}
