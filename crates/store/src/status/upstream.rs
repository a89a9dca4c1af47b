//! `status` over a team store's mirror: the plan for one project, found by walking upstream from
//! its own locations instead of reading every location of the store.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rusqlite::params;

use super::{last_from_row, Last, StatusPlan, Writers};
use crate::error::Result;
use crate::model::Role;
use crate::query::Store;

impl Store {
    /// The plan of [`Store::status_plan`] for the project at `root` alone: its locations, the
    /// outputs of the jobs run in it, and everything upstream of those (each last writer's
    /// inputs, their last writers, ...), found by walking from them instead of reading every
    /// location of the store. What a team store's mirror answers `status` with: the team's
    /// other projects are not this one's status, and reading them all grew with the team.
    pub fn status_plan_upstream(&self, root: &Path) -> Result<StatusPlan> {
        let read = || -> rusqlite::Result<StatusPlan> {
            // One read transaction for the walk's many statements (see `Store::lineage`).
            let _read = match self.conn.is_autocommit() {
                true => Some(self.conn.unchecked_transaction()?),
                false => None,
            };
            let (last, writers) = self.upstream_records(root)?;
            let jobs: Vec<i64> = writers.iter().map(|w| w.1).collect();
            self.plan_from(root, last, writers, Some(&jobs))
        };
        read().map_err(|e| self.err(e))
    }

    /// The last records and last writers of the locations of the project at `root` and of
    /// everything upstream of them (see [`Store::status_plan_upstream`]).
    fn upstream_records(&self, root: &Path) -> rusqlite::Result<(HashMap<String, Last>, Writers)> {
        let (from, to) = under(root);
        let mut queue: VecDeque<Vec<u8>> = self
            .conn
            .prepare(
                "SELECT DISTINCT path FROM job_files WHERE path >= ?1 AND path < ?2
                 UNION
                 SELECT path FROM job_files WHERE role = 'output' AND job_id IN (
                     SELECT id FROM jobs WHERE cwd = ?3 OR (cwd >= ?1 AND cwd < ?2))",
            )?
            .query_map(params![from, to, root.as_os_str().as_bytes()], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        // Every record of a location, once: its last (by time, as `last_of_each_path`) and its
        // last output are both picked from them.
        let mut records_of = self.conn.prepare(
            "SELECT f.path, f.role, f.job_id, a.blake3, a.sha256, a.size, f.ops,
                    coalesce(f.last_ns, f.first_ns, j.ended_ns, j.started_ns), f.id
             FROM job_files f JOIN jobs j ON j.id = f.job_id
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             WHERE f.path = ?1 AND f.role != 'temp'",
        )?;
        let mut files_of = self.conn.prepare(
            "SELECT path FROM job_files WHERE job_id = ?1 AND role != 'temp' AND NOT roar_noise(path)",
        )?;
        let (mut last, mut writers) = (HashMap::new(), Vec::new());
        let (mut seen, mut jobs) = (HashSet::new(), HashSet::new());
        while let Some(path) = queue.pop_front() {
            // Noise is judged once per path here, not on each of its records.
            if !seen.insert(path.clone()) || self.is_noise_bytes(&path) {
                continue;
            }
            let mut newest: Option<(When, String, Last)> = None;
            let mut written: Option<(When, (i64, Option<String>))> = None;
            let mut rows = records_of.query([&path])?;
            while let Some(r) = rows.next()? {
                let at: When = (r.get(7)?, r.get(8)?);
                let (p, l) = last_from_row(r)?;
                if l.role == Role::Output && written.as_ref().is_none_or(|w| w.0 < at) {
                    written = Some((at, (l.job, l.hash.as_ref().map(|h| h.blake3.clone()))));
                }
                if newest.as_ref().is_none_or(|n| n.0 < at) {
                    newest = Some((at, p, l));
                }
            }
            let Some((_, p, l)) = newest else { continue };
            last.insert(p.clone(), l);
            let Some((_, (job, Some(blake3)))) = written else {
                continue;
            };
            writers.push((p, job, blake3));
            if jobs.insert(job) {
                // Its inputs are upstream; its outputs say which of them it still holds.
                for p in files_of.query_map([job], |r| r.get::<_, Vec<u8>>(0))? {
                    queue.push_back(p?);
                }
            }
        }
        Ok((last, writers))
    }
}

/// When a record was made, as `last_of_each_path` orders records: its time, then its row id.
type When = (i64, i64);

/// The range of paths below `root`, as byte strings: from `root/` up to `root0` (`0` follows
/// `/`).
fn under(root: &Path) -> (Vec<u8>, Vec<u8>) {
    let r = root.as_os_str().as_bytes();
    ([r, b"/"].concat(), [r, b"0"].concat())
}
