//! `roar status`: which recorded files changed, and which outputs are stale because something
//! upstream of them changed — transitively, with the chain of jobs that carries the change.
//!
//! The plan is read from the store first ([`Store::status_plan`]); the caller looks at the files
//! it names (stat and hash cache, a read only when the identity changed) and hands back what it
//! found ([`StatusPlan::evaluate`]). Only the last record of each location counts: a job whose
//! every output was rewritten since by another job is history, not status. Over a team store's
//! mirror the plan is the project's own and what is upstream of it (`upstream.rs`).

mod held;
mod upstream;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use rusqlite::params;
use serde::Serialize;

use crate::error::Result;
use crate::model::{argv_from_blob, ContentHash, Ops, Role};
use crate::query::{hash_from, Store};
use crate::quote::shell_join;
use held::{held_outputs, StepsOf};

/// What is at a location now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Now {
    Missing,
    Content(String),
    /// Could not be read (permissions, a special file): never judged.
    Unknown,
}

/// The last record of one location.
#[derive(Debug, Clone)]
pub(super) struct Last {
    hash: Option<ContentHash>,
    role: Role,
    job: i64,
    /// The job moved or deleted the file itself: its absence is what was recorded.
    gone: bool,
}

/// A job, or one of its steps (SEMANTICS.md "Steps"): what status judges.
pub(super) type Node = (i64, Option<u32>);

#[derive(Debug, Clone)]
struct JobPlan {
    id: i64,
    step: Option<u32>,
    started: i64,
    label: String,
    /// Each input: its path, the content read (when known), and the step of the same job that
    /// wrote it (a step's input made inside its job).
    inputs: Vec<(String, Option<String>, Option<Node>)>,
    /// Outputs this job (or step) is still the last record of.
    outputs: Vec<String>,
}

impl JobPlan {
    fn node(&self) -> Node {
        (self.id, self.step)
    }
}

/// What `roar status` must look at, read from the store in one pass.
#[derive(Debug)]
pub struct StatusPlan {
    last: HashMap<String, Last>,
    /// The last writer of each location (the job, at the step that left it), and the content.
    made: HashMap<String, (Node, String)>,
    jobs: Vec<JobPlan>,
    root: std::path::PathBuf,
}

/// A recorded file whose content is not what was recorded last.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub path: String,
    /// modified | deleted
    pub state: &'static str,
    /// The job that made the recorded content, else the last job that read it.
    pub job: i64,
    /// Whether `job` made it (else it read it).
    pub made: bool,
    pub recorded: Option<String>,
    pub now: Option<String>,
}

/// Why a job's outputs are stale: the first changed input found, and the jobs the change went
/// through (the job that read it first, this job last).
#[derive(Debug, Clone, Serialize)]
pub struct Cause {
    pub path: String,
    /// modified | deleted | rewritten (a later job wrote the location)
    pub change: &'static str,
    pub chain: Vec<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StaleJob {
    pub job: i64,
    /// The step of the job whose outputs these are, when the job has steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    pub label: String,
    pub outputs: Vec<String>,
    /// The first of `causes`.
    pub because: Cause,
    /// Every input that makes the outputs stale: each changed one, then each made by a stale
    /// job (one per path).
    pub causes: Vec<Cause>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    /// Files of the project whose content changed since their last record.
    pub changed: Vec<Change>,
    /// Jobs whose current outputs would change if re-run, in the order they started.
    pub stale: Vec<StaleJob>,
}

impl StatusReport {
    pub fn is_clean(&self) -> bool {
        self.changed.is_empty() && self.stale.is_empty()
    }
}

/// A job whose row says it has not ended: running now, or `killed` (its recorder died).
#[derive(Debug, Clone, Serialize)]
pub struct Unfinished {
    pub job: i64,
    pub label: String,
    pub backend: String,
    pub started_ns: i64,
    /// running | killed
    pub status: String,
}

/// A query for the id of the last record of each path among the records `which` keeps, by time:
/// the record's last access, else its first, else its job's end, else its start; the row id
/// only breaks ties. Never by row id alone: a job's row is written when it starts (two jobs that
/// overlap write a path in the other order as often as not), and a team store's mirror numbers
/// jobs in the order they were pushed. (SQLite takes the bare `f.id` from the row of the `max`.)
fn last_of_each_path(which: &str) -> String {
    format!(
        "SELECT id FROM (
             SELECT f.id AS id, max(printf('%020d %020d',
                 coalesce(f.last_ns, f.first_ns, j.ended_ns, j.started_ns), f.id))
             FROM job_files f JOIN jobs j ON j.id = f.job_id
             WHERE f.{which} GROUP BY f.path)"
    )
}

impl Store {
    /// Jobs not ended yet (`roar run`s in progress, jobs under active mounts) and jobs whose
    /// recorder died, oldest first.
    pub fn unfinished(&self) -> Result<Vec<Unfinished>> {
        let read = || -> rusqlite::Result<Vec<Unfinished>> {
            let mut stmt = self.conn.prepare(
                "SELECT id, name, argv, backend, started_ns, status, recorder, host FROM jobs
                 WHERE status = 'running' ORDER BY started_ns, id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(Unfinished {
                    job: r.get(0)?,
                    label: job_label(r.get(1)?, r.get_ref(2)?.as_bytes()?),
                    backend: r.get(3)?,
                    started_ns: r.get(4)?,
                    status: crate::model::live_status(
                        r.get(5)?,
                        r.get(6)?,
                        r.get::<_, Option<String>>(7)?.as_deref(),
                    ),
                })
            })?;
            rows.collect()
        };
        read().map_err(|e| self.err(e))
    }

    /// Reads the last record of every location and the inputs of every job that is still the
    /// last writer of one; noise is left out (see [`Store::hide`]).
    pub fn status_plan(&self, root: &Path) -> Result<StatusPlan> {
        let read = || -> rusqlite::Result<StatusPlan> {
            let mut last = HashMap::new();
            let mut stmt = self.conn.prepare(&format!(
                "SELECT f.path, f.role, f.job_id, a.blake3, a.sha256, a.size, f.ops FROM job_files f
                 LEFT JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.id IN ({}) AND NOT roar_noise(f.path)",
                last_of_each_path("role != 'temp'")
            ))?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let (path, l) = last_from_row(r)?;
                last.insert(path, l);
            }
            let mut writers = self.conn.prepare(&format!(
                "SELECT f.path, f.job_id, a.blake3 FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.id IN ({}) AND NOT roar_noise(f.path)",
                last_of_each_path("role = 'output'")
            ))?;
            let writers = writers
                .query_map([], writer_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            self.plan_from(root, last, writers, None)
        };
        read().map_err(|e| self.err(e))
    }

    /// The rest of a plan, from the last records and last writers of the locations it judges;
    /// `jobs`, when given, holds every job among the writers (the steps read are theirs).
    pub(super) fn plan_from(
        &self,
        root: &Path,
        last: HashMap<String, Last>,
        writers: Writers,
        jobs: Option<&[i64]>,
    ) -> rusqlite::Result<StatusPlan> {
        let steps = self.steps_among(jobs)?;
        let (outputs, made) = held_outputs(&last, writers, &steps);
        let mut jobs = self.job_plans(outputs)?;
        // Producers before the jobs that read them.
        jobs.sort_by_key(|j| (j.started, j.id, j.step));
        Ok(StatusPlan {
            last,
            made,
            jobs,
            root: root.to_owned(),
        })
    }

    /// For jobs with steps (among `jobs`, when given): the step that left each output's final
    /// content, and every step.
    fn steps_among(&self, jobs: Option<&[i64]>) -> rusqlite::Result<StepsOf> {
        let among = jobs.map(|j| serde_json::to_string(j).unwrap_or_default());
        let mut final_step: HashMap<(i64, String), u32> = HashMap::new();
        let mut stmt = self.conn.prepare(
            "SELECT s.job_id, s.seq, f.path FROM step_files f JOIN steps s ON s.id = f.step_id
                 WHERE f.role = 'output' AND f.content = 'final'
                   AND (?1 IS NULL OR s.job_id IN (SELECT value FROM json_each(?1)))",
        )?;
        let mut rows = stmt.query([&among])?;
        while let Some(r) = rows.next()? {
            let path = String::from_utf8_lossy(r.get_ref(2)?.as_bytes()?).into_owned();
            final_step.insert((r.get(0)?, path), r.get(1)?);
        }
        let mut seqs: HashMap<i64, Vec<u32>> = HashMap::new();
        let mut stmt = self.conn.prepare(
            "SELECT job_id, seq FROM steps
                 WHERE ?1 IS NULL OR job_id IN (SELECT value FROM json_each(?1))",
        )?;
        let mut rows = stmt.query([&among])?;
        while let Some(r) = rows.next()? {
            seqs.entry(r.get(0)?).or_default().push(r.get(1)?);
        }
        Ok(StepsOf { final_step, seqs })
    }

    /// Each node's plan: its label, start, and inputs (with the content read), and `outputs`.
    fn job_plans(&self, outputs: BTreeMap<Node, Vec<String>>) -> rusqlite::Result<Vec<JobPlan>> {
        let mut jobs = Vec::with_capacity(outputs.len());
        let mut head = self
            .conn
            .prepare("SELECT name, argv, started_ns FROM jobs WHERE id = ?1")?;
        let mut ins = self.conn.prepare(
            "SELECT f.path, a.blake3 FROM job_files f LEFT JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.job_id = ?1 AND f.role = 'input' AND NOT roar_noise(f.path)",
        )?;
        let mut step_head = self
            .conn
            .prepare("SELECT id, argv, started_ns FROM steps WHERE job_id = ?1 AND seq = ?2")?;
        let mut step_ins = self.conn.prepare(
                "SELECT f.path, a.blake3, f.from_seq FROM step_files f
                 LEFT JOIN job_files j ON j.job_id = ?1 AND j.path = f.path
                      AND j.role = CASE f.content WHEN 'prior' THEN 'input' WHEN 'final' THEN 'output' END
                 LEFT JOIN artifacts a ON a.id = j.artifact_id
                 WHERE f.step_id = ?2 AND f.role = 'input' AND NOT roar_noise(f.path)",
            )?;
        for ((id, step), mut outs) in outputs {
            if let Some(seq) = step {
                let (step_id, argv, started): (i64, Vec<u8>, Option<i64>) = step_head
                    .query_row(params![id, seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                let inputs = step_ins
                    .query_map(params![id, step_id], |r| {
                        Ok((
                            String::from_utf8_lossy(r.get_ref(0)?.as_bytes()?).into_owned(),
                            r.get(1)?,
                            r.get::<_, Option<u32>>(2)?.map(|w| (id, Some(w))),
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let job_started: i64 = head.query_row([id], |r| r.get(2))?;
                outs.sort();
                jobs.push(JobPlan {
                    id,
                    step,
                    started: started.unwrap_or(job_started),
                    label: shell_join(&argv_from_blob(&argv)),
                    inputs,
                    outputs: outs,
                });
                continue;
            }
            let (label, started): (String, i64) = head.query_row([id], |r| {
                Ok((job_label(r.get(0)?, r.get_ref(1)?.as_bytes()?), r.get(2)?))
            })?;
            let inputs = ins
                .query_map([id], |r| {
                    Ok((
                        String::from_utf8_lossy(r.get_ref(0)?.as_bytes()?).into_owned(),
                        r.get(1)?,
                        None,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            outs.sort();
            jobs.push(JobPlan {
                id,
                step: None,
                started,
                label,
                inputs,
                outputs: outs,
            });
        }
        Ok(jobs)
    }
}

/// How status names a job: `[NAME] ARGV` when it has a name, else its command line.
fn job_label(name: Option<String>, argv: &[u8]) -> String {
    let argv = shell_join(&argv_from_blob(argv));
    match name {
        Some(n) => format!("[{n}] {argv}"),
        None => argv,
    }
}

/// The last writers of locations: the path, the job, the content it left.
pub(super) type Writers = Vec<(String, i64, String)>;

fn writer_from_row(r: &rusqlite::Row) -> rusqlite::Result<(String, i64, String)> {
    Ok((
        String::from_utf8_lossy(r.get_ref(0)?.as_bytes()?).into_owned(),
        r.get(1)?,
        r.get(2)?,
    ))
}

/// A location's last record from a row of (path, role, job, blake3, sha256, size, ops).
pub(super) fn last_from_row(r: &rusqlite::Row) -> rusqlite::Result<(String, Last)> {
    let path = String::from_utf8_lossy(r.get_ref(0)?.as_bytes()?).into_owned();
    let role: String = r.get(1)?;
    let ops = Ops::parse(&r.get::<_, String>(6)?);
    Ok((
        path,
        Last {
            role: Role::parse(&role),
            job: r.get(2)?,
            hash: hash_from(r.get(3)?, r.get(4)?, r.get(5)?),
            // The job moved or deleted the file itself: its absence is what was recorded.
            gone: ops.contains(Ops::UNLINK) || (ops.contains(Ops::RENAME) && role == "input"),
        },
    ))
}

impl StatusPlan {
    /// Whether the store has a record (not a temp) of `path`.
    pub fn knows(&self, path: &str) -> bool {
        self.last.contains_key(path)
    }

    /// The files to look at: every recorded location in the project and every input of a job
    /// that still counts, wherever it is (S3 objects are judged from the record alone).
    pub fn paths(&self) -> Vec<String> {
        let mut out: HashSet<&str> = self
            .last
            .keys()
            .filter(|p| Path::new(p).starts_with(&self.root))
            .map(String::as_str)
            .collect();
        for j in &self.jobs {
            out.extend(j.inputs.iter().map(|(p, ..)| p.as_str()));
        }
        let mut v: Vec<String> = out
            .into_iter()
            .filter(|p| !p.starts_with("s3://"))
            .map(str::to_owned)
            .collect();
        v.sort();
        v
    }

    /// Judges the plan against what is at each location now (`now` has an entry for every path
    /// of [`StatusPlan::paths`]).
    pub fn evaluate(&self, now: &HashMap<String, Now>) -> StatusReport {
        let mut changed = Vec::new();
        let mut state: HashMap<&str, (&'static str, Option<&str>)> = HashMap::new();
        for (path, l) in &self.last {
            let Some(now) = self.now_at(path, now) else {
                continue;
            };
            let recorded = l.hash.as_ref().map(|h| h.blake3.as_str());
            let st = match (recorded, &now) {
                (_, Now::Unknown) => continue,
                (_, Now::Missing) if l.gone => continue,
                (Some(_), Now::Missing) => "deleted",
                (Some(r), Now::Content(c)) if r != c => "modified",
                _ => continue,
            };
            state.insert(path.as_str(), (st, recorded));
            if Path::new(path).starts_with(&self.root) {
                let maker = self
                    .made
                    .get(path)
                    .filter(|(_, c)| Some(c.as_str()) == recorded)
                    .map(|((j, _), _)| *j);
                changed.push(Change {
                    path: path.clone(),
                    state: st,
                    job: maker.unwrap_or(l.job),
                    made: maker.is_some(),
                    recorded: recorded.map(str::to_owned),
                    now: match now {
                        Now::Content(c) => Some(c),
                        _ => None,
                    },
                });
            }
        }
        changed.sort_by(|a, b| a.path.cmp(&b.path));

        let mut stale: HashMap<Node, Vec<Cause>> = HashMap::new();
        // Jobs are in start order, so a producer is usually judged before its readers; the loop
        // repeats until nothing new is found for the rare reader recorded out of order.
        loop {
            let mut found = false;
            for j in &self.jobs {
                if stale.contains_key(&j.node()) {
                    continue;
                }
                let causes = self.causes(j, now, &stale);
                if !causes.is_empty() {
                    stale.insert(j.node(), causes);
                    found = true;
                }
            }
            if !found {
                break;
            }
        }
        let stale = self
            .jobs
            .iter()
            .filter_map(|j| {
                let causes = stale.get(&j.node())?.clone();
                // An output changed by hand is reported as modified, not as stale.
                let outputs: Vec<String> = j
                    .outputs
                    .iter()
                    .filter(|o| !state.contains_key(o.as_str()))
                    .cloned()
                    .collect();
                (!outputs.is_empty()).then(|| StaleJob {
                    job: j.id,
                    step: j.step,
                    label: j.label.clone(),
                    outputs,
                    because: causes[0].clone(),
                    causes,
                })
            })
            .collect();
        StatusReport { changed, stale }
    }

    fn now_at(&self, path: &str, now: &HashMap<String, Now>) -> Option<Now> {
        if path.starts_with("s3://") {
            // roar cannot look into a bucket without a client's credentials: an object's current
            // content is the last one recorded for it.
            let l = self.last.get(path)?;
            return Some(match &l.hash {
                Some(h) => Now::Content(h.blake3.clone()),
                None => Now::Missing,
            });
        }
        now.get(path).cloned()
    }

    fn causes(
        &self,
        j: &JobPlan,
        now: &HashMap<String, Now>,
        stale: &HashMap<Node, Vec<Cause>>,
    ) -> Vec<Cause> {
        let mut direct = Vec::new();
        let mut inherited: Vec<Cause> = Vec::new();
        let through = |up: &[Cause]| {
            let mut c = up[0].clone();
            // The chain names jobs: a step after another of the same job adds nothing.
            if c.chain.last() != Some(&j.id) {
                c.chain.push(j.id);
            }
            c
        };
        let mut inherit = |c: Cause| {
            if !inherited.iter().any(|i| i.path == c.path) {
                inherited.push(c);
            }
        };
        for (path, read, within) in &j.inputs {
            // Made by another step of the same job, itself stale.
            if let Some(up) = within.and_then(|w| stale.get(&w)) {
                inherit(through(up));
            }
            let Some(read) = read else { continue };
            // Unchanged, but made by a job (or another job's step) that is itself stale.
            if within.is_none() {
                let up = self
                    .made
                    .get(path)
                    .filter(|(w, c)| c == read && w.0 != j.id);
                if let Some(up) = up.and_then(|(w, _)| stale.get(w)) {
                    inherit(through(up));
                }
            }
            let last = self.last.get(path);
            // The job changed or moved that file itself (an in-place update, a rename away): its
            // own doing, not a change.
            if last.is_some_and(|l| l.job == j.id && (l.role == Role::Output || l.gone)) {
                continue;
            }
            let change = match self.now_at(path, now) {
                Some(Now::Missing) => Some("deleted"),
                Some(Now::Content(c)) if &c != read => Some(match last {
                    Some(l)
                        if l.role == Role::Output
                            && l.hash.as_ref().is_some_and(|h| h.blake3 == c) =>
                    {
                        "rewritten"
                    }
                    _ => "modified",
                }),
                _ => None,
            };
            if let Some(change) = change {
                direct.push(Cause {
                    path: path.clone(),
                    change,
                    chain: vec![j.id],
                });
            }
        }
        direct.extend(inherited);
        direct
    }
}
