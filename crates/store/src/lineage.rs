//! Lineage: how a file version was made (the jobs upstream of it, down to root inputs) and the
//! whole project graph.
//!
//! A node of the graph is a file version: a location (a path or `s3://bucket/key`) at a content.
//! Content is an attribute, never the identity: the producer of an input is the last job, started
//! before the reader, that wrote *that location* with *that content*. Only when no job ever wrote
//! the location does content find a producer elsewhere — one that started before any job read
//! those bytes there — and the edge says so (`copy_of`). Since a
//! producer always started strictly before its reader, the graph has no cycles by construction.
//! The ranks of a distributed run are one computation: a rank in a lineage brings every other
//! rank of its run with it (their inputs are the run's inputs).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
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
    /// blake3 of the dirty tree's diff, kept in the store ([`crate::Store::job_patch`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub git_diff: Option<String>,
    pub host: Option<String>,
    /// How it was observed: preload, ptrace, mount, gateway.
    pub backend: String,
    /// The distributed run the job is one rank of: every rank of it is in the lineage of any
    /// of its outputs (ranks exchange data in memory, which no file records).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dist: Option<crate::Distributed>,
    /// The step of the job this node is (SEMANTICS.md "Steps"): argv, cwd, times and files are
    /// the step's. None: the whole job (a job of one step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// The step's parent step in the job's tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_step: Option<u32>,
    /// The step's standard streams that were files opened for it: a re-run redirects them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<crate::model::Stream>,
    pub inputs: Vec<Edge>,
    pub outputs: Vec<Edge>,
    /// Set on the project's whole graph by [`Dag::fold_reruns`]: a later run replaced what this
    /// step did and nothing still current needs it. Views show the latest runs by default.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// The superseded runs of the same command this (current) step stands for.
    #[serde(skip_serializing_if = "is_zero")]
    pub earlier_runs: u32,
    /// The job's labels (`roar label`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// What a walk over the graph learns once and asks again and again: content no job ever wrote (a
/// dataset every job reads), and which jobs have steps.
#[derive(Default)]
struct Memo {
    never_made: HashSet<i64>,
    has_steps: HashMap<i64, bool>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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

/// One file version a step read or wrote; for an input, the job that produced it, if any.
#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    pub path: String,
    pub hash: Option<ContentHash>,
    pub producer: Option<i64>,
    /// The step of the producer job that wrote it, when that job has steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub producer_step: Option<u32>,
    /// The same bytes at another location: for an input, where its producer wrote them (no job
    /// wrote this path); for an output, the input of the same job it is a copy of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_of: Option<String>,
}

/// What a PATH or HASH argument names: a file version, or (for a hash) content anywhere.
#[derive(Debug, Clone, Serialize)]
pub struct Version {
    /// The location, when the argument was a path.
    pub path: Option<String>,
    pub hash: ContentHash,
}

/// How one file version was made: the steps in the order they started, and the root inputs.
#[derive(Debug, Clone, Serialize)]
pub struct Lineage {
    pub target: ContentHash,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub steps: Vec<Step>,
    pub roots: Vec<Edge>,
}

/// The whole project's graph: every job, or each step of a job that has steps, in the order the
/// jobs started.
#[derive(Debug, Clone, Serialize)]
pub struct Dag {
    pub steps: Vec<Step>,
}

impl Dag {
    /// Folds re-runs (SEMANTICS.md "Latest runs"): a step is *current* when it left the last
    /// version recorded at one of the locations it wrote, or, writing nothing, when no later step
    /// is the same command (`same` gives that identity: name and directory). Current steps, and
    /// the producers of every version they read (transitively), are shown; the rest are
    /// `superseded` and counted on the latest shown step of the same command as `earlier_runs`.
    /// Steps are in the order they started (as [`Store::dag`] gives them).
    pub fn fold_reruns(&mut self, same: impl Fn(&Step) -> String) {
        let steps = &mut self.steps;
        let mut last_writer: HashMap<&str, usize> = HashMap::new();
        let mut last_of: HashMap<String, usize> = HashMap::new();
        let identity: Vec<String> = steps.iter().map(&same).collect();
        for (i, s) in steps.iter().enumerate() {
            for o in &s.outputs {
                last_writer.insert(o.path.as_str(), i);
            }
            last_of.insert(identity[i].clone(), i);
        }
        let mut shown: Vec<bool> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.outputs.is_empty() {
                    last_of[&identity[i]] == i
                } else {
                    s.outputs.iter().any(|o| last_writer[o.path.as_str()] == i)
                }
            })
            .collect();
        let index: HashMap<(i64, Option<u32>), usize> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.job_id, s.step), i))
            .collect();
        // Producers start before their readers: one pass from the end closes the set.
        for i in (0..steps.len()).rev() {
            if !shown[i] {
                continue;
            }
            for e in &steps[i].inputs {
                if let Some(&p) = e.producer.and_then(|j| index.get(&(j, e.producer_step))) {
                    shown[p] = true;
                }
            }
        }
        let mut latest_shown: HashMap<&str, usize> = HashMap::new();
        for (i, id) in identity.iter().enumerate() {
            if shown[i] {
                latest_shown.insert(id.as_str(), i);
            }
        }
        let mut folded = vec![0u32; steps.len()];
        for (i, id) in identity.iter().enumerate() {
            if !shown[i] {
                if let Some(&k) = latest_shown.get(id.as_str()).filter(|&&k| k > i) {
                    folded[k] += 1;
                }
            }
        }
        for (i, s) in steps.iter_mut().enumerate() {
            s.superseded = !shown[i];
            s.earlier_runs = folded[i];
        }
    }
}

/// `3` for job 3, `3.2` for its step 2.
pub fn node_name(job: i64, step: Option<u32>) -> String {
    match step {
        Some(s) => format!("{job}.{s}"),
        None => job.to_string(),
    }
}

/// A lineage node: a job, or one of its steps.
type Node = (i64, Option<u32>);

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A producer as the lookups find it: the job, and where it wrote the content when that is not
/// the location asked about.
type Producer = (i64, Option<String>);

impl Store {
    /// The version recorded last at `path` (as an output, else as an input).
    pub fn version_at(&self, path: &Path) -> Result<Version> {
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
        match found {
            Some(hash) => Ok(Version {
                path: Some(path.to_string_lossy().into_owned()),
                hash,
            }),
            None => Err(StoreError::UnknownPath {
                path: path.to_owned(),
            }),
        }
    }

    /// The content recorded last at `path`.
    pub fn artifact_at(&self, path: &Path) -> Result<ContentHash> {
        Ok(self.version_at(path)?.hash)
    }

    /// Who made the content `artifact` found at `path` by a job (`reader`, or none) that started
    /// at `before_ns`: the last job started before it that wrote that path with that content;
    /// else, only if no job wrote the path at all, the last that wrote the content anywhere.
    fn producer_of(
        &self,
        path: &[u8],
        artifact: i64,
        reader: i64,
        before_ns: i64,
        memo: &mut Memo,
    ) -> rusqlite::Result<Option<Producer>> {
        // The last writer of the path before the reader, one with these bytes first: a writer
        // with other bytes only means the path changed outside roar since (no producer).
        let here: Option<(i64, bool)> = self
            .conn
            .prepare_cached(
                "SELECT f.job_id, f.artifact_id IS ?2 AS same FROM job_files f
                 JOIN jobs j ON j.id = f.job_id
                 WHERE f.path = ?1 AND f.role = 'output' AND f.job_id != ?3 AND j.started_ns < ?4
                 ORDER BY same DESC, j.started_ns DESC, f.job_id DESC LIMIT 1",
            )?
            .query_row(params![path, artifact, reader, before_ns], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        match here {
            Some((job, true)) => return Ok(Some((job, None))),
            Some((_, false)) => return Ok(None),
            None => {}
        }
        // No job wrote the path: the content, wherever a job wrote it (a copy roar did not see),
        // by a job that started before any job found these bytes here — one that read them here
        // (the `cp` that copied this dataset elsewhere) came after them, it did not make them.
        // Content no job ever wrote (a dataset every step reads) is remembered for the walk.
        if memo.never_made.contains(&artifact) {
            return Ok(None);
        }
        let first_read: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT MIN(j.started_ns) FROM job_files f JOIN jobs j ON j.id = f.job_id
                 WHERE f.path = ?1 AND f.artifact_id = ?2 AND f.role = 'input'",
            )?
            .query_row(params![path, artifact], |r| r.get(0))?;
        let before_ns = first_read.map_or(before_ns, |t| t.min(before_ns));
        let found: Option<(i64, String, i64)> = self
            .conn
            .prepare_cached(
                "SELECT f.job_id, f.path, j.started_ns < ?3 AND f.job_id != ?2 AS before FROM job_files f
                 JOIN jobs j ON j.id = f.job_id
                 WHERE f.artifact_id = ?1 AND f.role = 'output'
                 ORDER BY before DESC, j.started_ns DESC, f.job_id DESC LIMIT 1",
            )?
            .query_row(params![artifact, reader, before_ns], |r| {
                Ok((r.get(0)?, lossy(r.get_ref(1)?.as_bytes()?), r.get(2)?))
            })
            .optional()?;
        match found {
            Some((job, at, 1)) => Ok(Some((job, Some(at)))),
            Some(_) => Ok(None),
            None => {
                memo.never_made.insert(artifact);
                Ok(None)
            }
        }
    }

    /// The job that made `target` (see [`Store::lineage`]), if a recorded one did.
    pub fn made_by(&self, target: &Version) -> Result<Option<i64>> {
        Ok(self
            .maker(target)
            .map_err(|e| self.err(e))?
            .map(|(job, _)| job))
    }

    /// The node that made `target`: its maker job, at the step of it that left the content.
    fn maker_node(&self, target: &Version) -> rusqlite::Result<Option<Node>> {
        let Some((job, at)) = self.maker(target)? else {
            return Ok(None);
        };
        let step = match at.as_deref().or(target.path.as_deref()) {
            Some(path) => self.step_that_made(job, path.as_bytes())?,
            None => self.step_that_made_content(job, &target.hash.blake3)?,
        };
        Ok(Some((job, step)))
    }

    /// The step of job `job` whose final output has content `blake3`.
    fn step_that_made_content(&self, job: i64, blake3: &str) -> rusqlite::Result<Option<u32>> {
        let path: Option<Vec<u8>> = self
            .conn
            .prepare_cached(
                "SELECT f.path FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.job_id = ?1 AND f.role = 'output' AND a.blake3 = ?2 LIMIT 1",
            )?
            .query_row(params![job, blake3], |r| r.get(0))
            .optional()?;
        match path {
            Some(p) => self.step_that_made(job, &p),
            None => Ok(None),
        }
    }

    fn artifact_id(&self, blake3: &str) -> rusqlite::Result<Option<i64>> {
        self.conn
            .prepare_cached("SELECT id FROM artifacts WHERE blake3 = ?1")?
            .query_row([blake3], |r| r.get(0))
            .optional()
    }

    /// The job that made `target`: for a path, by the rule of [`Store::producer_of`] with no
    /// time bound; for content alone, the last job that wrote it anywhere.
    fn maker(&self, target: &Version) -> rusqlite::Result<Option<Producer>> {
        let Some(artifact) = self.artifact_id(&target.hash.blake3)? else {
            return Ok(None);
        };
        match &target.path {
            Some(p) => self.producer_of(p.as_bytes(), artifact, -1, i64::MAX, &mut Memo::default()),
            None => self
                .conn
                .prepare_cached(
                    "SELECT f.job_id FROM job_files f JOIN jobs j ON j.id = f.job_id
                     WHERE f.artifact_id = ?1 AND f.role = 'output'
                     ORDER BY j.started_ns DESC, f.job_id DESC LIMIT 1",
                )?
                .query_row([artifact], |r| Ok((r.get(0)?, None)))
                .optional(),
        }
    }

    /// The step of `job` that wrote `path` last, if the job has steps (asked once per job).
    fn producer_step(
        &self,
        job: i64,
        path: &[u8],
        memo: &mut Memo,
    ) -> rusqlite::Result<Option<u32>> {
        let has_steps = match memo.has_steps.get(&job) {
            Some(&known) => known,
            None => {
                let has: bool = self
                    .conn
                    .prepare_cached("SELECT EXISTS (SELECT 1 FROM steps WHERE job_id = ?1)")?
                    .query_row([job], |r| r.get(0))?;
                memo.has_steps.insert(job, has);
                has
            }
        };
        match has_steps {
            true => self.step_that_made(job, path),
            false => Ok(None),
        }
    }

    /// A lineage node: a whole job, or one of its steps.
    fn node(&self, (job, seq): Node, memo: &mut Memo) -> rusqlite::Result<Step> {
        match seq {
            Some(seq) => self.step_node(job, seq, memo),
            None => self.step(job, memo),
        }
    }

    /// Step `seq` of job `job_id`: the job's attributes with the step's command, times and files.
    /// An input another step of the job wrote comes from that step; one the job found comes
    /// from whoever made it before the job, as for a whole job.
    fn step_node(&self, job_id: i64, seq: u32, memo: &mut Memo) -> rusqlite::Result<Step> {
        let mut node = self.job_header(job_id)?;
        let Some(detail) = self.step_detail(job_id, seq)? else {
            return self.step(job_id, memo);
        };
        node.step = Some(seq);
        node.parent_step = detail.parent;
        node.streams = detail.streams;
        node.argv = detail.argv;
        node.cwd = detail.cwd;
        node.started_ns = detail.started_ns.unwrap_or(node.started_ns);
        node.ended_ns = detail.ended_ns;
        if seq != 1 {
            // Only the root's exit status is observed.
            node.exit_code = None;
        }
        for i in detail.inputs {
            let mut edge = Edge {
                path: i.path,
                hash: i.hash,
                producer: None,
                producer_step: None,
                copy_of: None,
            };
            if let Some(w) = i.from_step {
                edge.producer = Some(job_id);
                edge.producer_step = Some(w);
            } else if let Some(artifact) = edge
                .hash
                .as_ref()
                .map(|h| self.artifact_id(&h.blake3))
                .transpose()?
                .flatten()
            {
                let found = self.producer_of(
                    edge.path.as_bytes(),
                    artifact,
                    job_id,
                    node.started_ns,
                    memo,
                )?;
                if let Some((job, copy_of)) = found {
                    let at = copy_of.as_deref().unwrap_or(&edge.path);
                    edge.producer_step = self.producer_step(job, at.as_bytes(), memo)?;
                    edge.producer = Some(job);
                    edge.copy_of = copy_of;
                }
            }
            node.inputs.push(edge);
        }
        node.outputs = detail
            .outputs
            .into_iter()
            .map(|o| Edge {
                path: o.path,
                hash: o.hash,
                producer: None,
                producer_step: None,
                copy_of: None,
            })
            .collect();
        Ok(node)
    }

    /// A job's row as a lineage node, without files.
    fn job_header(&self, job_id: i64) -> rusqlite::Result<Step> {
        self
            .conn
            .prepare_cached(
                "SELECT name, argv, cwd, started_ns, ended_ns, status, exit_code, git_commit, git_dirty, host,
                        backend, recorder, git_diff, run_group, rank, world_size, local_rank,
                        node_rank
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
                    status: crate::model::live_status(
                        r.get(5)?,
                        r.get(11)?,
                        r.get::<_, Option<String>>(9)?.as_deref(),
                    ),
                    exit_code: r.get(6)?,
                    git_commit: r.get(7)?,
                    git_dirty: r.get(8)?,
                    git_diff: r.get(12)?,
                    host: r.get(9)?,
                    backend: r.get(10)?,
                    dist: r
                        .get::<_, Option<String>>(13)?
                        .map(|group| -> rusqlite::Result<crate::Distributed> {
                            Ok(crate::Distributed {
                                group,
                                rank: r.get(14)?,
                                world_size: r.get(15)?,
                                local_rank: r.get(16)?,
                                node_rank: r.get(17)?,
                            })
                        })
                        .transpose()?,
                    step: None,
                    parent_step: None,
                    streams: Vec::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    superseded: false,
                    earlier_runs: 0,
                    labels: BTreeMap::new(),
                })
            })
            .and_then(|mut step| {
                step.labels = self
                    .conn
                    .prepare_cached("SELECT key, value FROM labels WHERE job_id = ?1")?
                    .query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(step)
            })
    }

    /// One job with its non-temp files.
    fn step(&self, job_id: i64, memo: &mut Memo) -> rusqlite::Result<Step> {
        let mut step = self.job_header(job_id)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT f.role, f.path, f.artifact_id, a.blake3, a.sha256, a.size FROM job_files f
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             WHERE f.job_id = ?1 AND f.role != 'temp' AND NOT roar_noise(f.path)
             ORDER BY f.path",
        )?;
        let rows = stmt
            .query_map([job_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get_ref(1)?.as_bytes()?.to_vec(),
                    r.get::<_, Option<i64>>(2)?,
                    hash_from(r.get(3)?, r.get(4)?, r.get(5)?),
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for (role, path, artifact, hash) in rows {
            let mut edge = Edge {
                path: lossy(&path),
                hash,
                producer: None,
                producer_step: None,
                copy_of: None,
            };
            if role == "input" {
                if let Some(artifact) = artifact {
                    if let Some((job, copy_of)) =
                        self.producer_of(&path, artifact, job_id, step.started_ns, memo)?
                    {
                        let at = copy_of.as_ref().map_or(&path[..], |c| c.as_bytes());
                        edge.producer_step = self.producer_step(job, at, memo)?;
                        edge.producer = Some(job);
                        edge.copy_of = copy_of;
                    }
                }
                step.inputs.push(edge);
            } else {
                step.outputs.push(edge);
            }
        }
        // An output with the bytes of one of the job's inputs elsewhere is a copy of it.
        let read: HashMap<&str, &str> = step
            .inputs
            .iter()
            .filter_map(|i| Some((i.hash.as_ref()?.blake3.as_str(), i.path.as_str())))
            .collect();
        let copies: Vec<Option<String>> = step
            .outputs
            .iter()
            .map(|o| {
                let from = read.get(o.hash.as_ref()?.blake3.as_str())?;
                (*from != o.path).then(|| from.to_string())
            })
            .collect();
        for (o, c) in step.outputs.iter_mut().zip(copies) {
            o.copy_of = c;
        }
        Ok(step)
    }

    /// The jobs upstream of `target`, in the order they started, and the root inputs they start
    /// from.
    pub fn lineage(&self, target: &Version) -> Result<Lineage> {
        let walk = || -> rusqlite::Result<Lineage> {
            // One read transaction for the walk's thousands of statements (each would otherwise
            // take and drop the store's read lock); none if the caller holds one already.
            let _read = match self.conn.is_autocommit() {
                true => Some(self.conn.unchecked_transaction()?),
                false => None,
            };
            let mut steps: BTreeMap<Node, Step> = BTreeMap::new();
            let mut roots: BTreeMap<(String, String), Edge> = BTreeMap::new();
            let mut seen = HashSet::new();
            let mut memo = Memo::default();
            let mut queue = VecDeque::new();
            if let Some(node) = self.maker_node(target)? {
                queue.push_back(node);
            }
            while let Some(node) = queue.pop_front() {
                if !seen.insert(node) {
                    continue;
                }
                let step = self.node(node, &mut memo)?;
                if step.dist.is_some() {
                    for peer in self.run_peers(node.0)? {
                        queue.push_back((peer, None));
                    }
                }
                for input in &step.inputs {
                    match input.producer {
                        Some(p) => queue.push_back((p, input.producer_step)),
                        None => {
                            let content = input.hash.as_ref().map(|h| h.blake3.clone());
                            roots
                                .entry((input.path.clone(), content.unwrap_or_default()))
                                .or_insert_with(|| input.clone());
                        }
                    }
                }
                steps.insert(node, step);
            }
            // In the order they ran (the mount records a job when it ends, so ids can be out
            // of order).
            let mut steps: Vec<Step> = steps.into_values().collect();
            steps.sort_by_key(|s| (s.started_ns, s.job_id, s.step));
            Ok(Lineage {
                target: target.hash.clone(),
                path: target.path.clone(),
                steps,
                roots: roots.into_values().collect(),
            })
        };
        walk().map_err(|e| self.err(e))
    }

    /// Every job of the project in the order they started, with the producers of their inputs;
    /// with a target, only the jobs that made it (its lineage).
    pub fn dag(&self, target: Option<&Version>) -> Result<Dag> {
        if let Some(t) = target {
            return Ok(Dag {
                steps: self.lineage(t)?.steps,
            });
        }
        let walk = || -> rusqlite::Result<Dag> {
            let ids: Vec<i64> = self
                .conn
                .prepare(
                    "SELECT id FROM jobs WHERE status != 'failed_to_start' ORDER BY started_ns, id",
                )?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let mut memo = Memo::default();
            let mut steps = Vec::with_capacity(ids.len());
            for id in ids {
                let seqs = self.step_seqs(id)?;
                if seqs.is_empty() {
                    steps.push(self.step(id, &mut memo)?);
                }
                for seq in seqs {
                    steps.push(self.step_node(id, seq, &mut memo)?);
                }
            }
            Ok(Dag { steps })
        };
        walk().map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(path: &str, producer: Option<i64>) -> Edge {
        Edge {
            path: path.into(),
            hash: None,
            producer,
            producer_step: None,
            copy_of: None,
        }
    }

    fn step(job_id: i64, name: &str, inputs: Vec<Edge>, outputs: &[&str]) -> Step {
        Step {
            job_id,
            name: Some(name.into()),
            argv: vec![name.into()],
            cwd: "/p".into(),
            started_ns: job_id,
            ended_ns: None,
            status: "exited".into(),
            exit_code: Some(0),
            git_commit: None,
            git_dirty: None,
            git_diff: None,
            host: None,
            backend: "preload".into(),
            dist: None,
            step: None,
            parent_step: None,
            streams: Vec::new(),
            inputs,
            outputs: outputs.iter().map(|p| edge(p, None)).collect(),
            superseded: false,
            earlier_runs: 0,
            labels: BTreeMap::new(),
        }
    }

    fn folded(steps: Vec<Step>) -> Vec<(i64, bool, u32)> {
        let mut dag = Dag { steps };
        dag.fold_reruns(|s| s.name.clone().unwrap_or_default());
        dag.steps
            .iter()
            .map(|s| (s.job_id, s.superseded, s.earlier_runs))
            .collect()
    }

    #[test]
    fn a_rerun_folds_the_run_it_replaced_unless_a_current_job_read_it() {
        // prep 1, train 2 (reads prep 1), prep 3 (rewrites data), train 4 (reads prep 3),
        // train 5 (reads prep 3, rewrites the model): train 2 and 4 are replaced; prep 1 is
        // read by nothing current any more.
        let got = folded(vec![
            step(1, "prep", vec![edge("/p/raw", None)], &["/p/data"]),
            step(2, "train", vec![edge("/p/data", Some(1))], &["/p/model"]),
            step(3, "prep", vec![edge("/p/raw", None)], &["/p/data"]),
            step(4, "train", vec![edge("/p/data", Some(3))], &["/p/model"]),
            step(5, "train", vec![edge("/p/data", Some(3))], &["/p/model"]),
        ]);
        assert_eq!(
            got,
            [
                (1, true, 0),
                (2, true, 0),
                (3, false, 1),
                (4, true, 0),
                (5, false, 2)
            ]
        );
    }

    /// Seeded random histories of runs (a few names, a few paths, each run reading the latest
    /// version of some paths and writing others): the fold keeps every path's last writer, is
    /// closed under producers, hides only runs whose every output was written again (or, writing
    /// nothing, a later run of the name), and counts each hidden run on at most one later run of
    /// its name. Replay one with ROAR_FOLD_SEED.
    #[test]
    fn the_fold_holds_its_rules_on_generated_histories() {
        let seeds: Vec<u64> = match std::env::var("ROAR_FOLD_SEED") {
            Ok(s) => vec![s.parse().expect("ROAR_FOLD_SEED is a number")],
            Err(_) => (1..=500).collect(),
        };
        for seed in seeds {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let names = ["prep", "train", "eval", "report"];
            let paths = ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"];
            let mut writer: HashMap<&str, i64> = HashMap::new();
            let mut steps = Vec::new();
            for job in 1..=(3 + next(20) as i64) {
                let inputs: Vec<Edge> = (0..next(3))
                    .map(|_| paths[next(5) as usize])
                    .map(|p| edge(p, writer.get(p).copied()))
                    .collect();
                let outputs: Vec<&str> = (0..next(3)).map(|_| paths[next(5) as usize]).collect();
                for o in &outputs {
                    writer.insert(o, job);
                }
                steps.push(step(job, names[next(4) as usize], inputs, &outputs));
            }
            let mut dag = Dag { steps };
            dag.fold_reruns(|s| s.name.clone().unwrap_or_default());
            let st = &dag.steps;
            let at = |job: i64| st.iter().find(|s| s.job_id == job).expect("a step per job");
            let why = format!(
                "seed {seed} (ROAR_FOLD_SEED={seed}): {:?}",
                st.iter()
                    .map(|s| (
                        s.job_id,
                        s.name.clone(),
                        s.outputs.iter().map(|o| o.path.clone()).collect::<Vec<_>>(),
                        s.superseded,
                        s.earlier_runs
                    ))
                    .collect::<Vec<_>>()
            );
            for job in writer.values() {
                assert!(
                    !at(*job).superseded,
                    "a path's last writer is hidden; {why}"
                );
            }
            for (i, s) in st.iter().enumerate() {
                if !s.superseded {
                    for e in &s.inputs {
                        if let Some(p) = e.producer {
                            assert!(!at(p).superseded, "a shown run's producer is hidden; {why}");
                        }
                    }
                    continue;
                }
                let later = &st[i + 1..];
                if s.outputs.is_empty() {
                    assert!(
                        later.iter().any(|l| l.name == s.name),
                        "a latest run hidden; {why}"
                    );
                } else {
                    assert!(
                        s.outputs.iter().all(|o| later
                            .iter()
                            .any(|l| l.outputs.iter().any(|lo| lo.path == o.path))),
                        "a run hidden with an output nobody wrote again; {why}"
                    );
                }
            }
            for (i, s) in st.iter().enumerate() {
                let hidden_before = st[..i]
                    .iter()
                    .filter(|h| h.superseded && h.name == s.name)
                    .count();
                assert!(
                    s.earlier_runs as usize <= hidden_before,
                    "counted more runs than were hidden; {why}"
                );
            }
            let counted: u32 = st.iter().map(|s| s.earlier_runs).sum();
            assert!(
                counted as usize <= st.iter().filter(|s| s.superseded).count(),
                "{why}"
            );
        }
    }

    #[test]
    fn what_the_current_model_was_made_from_stays_drawn() {
        // prep ran again after train: train still holds the latest model, made from prep 1's
        // data, so prep 1 stays (its data is an older version), and nothing is folded into it.
        let got = folded(vec![
            step(1, "prep", vec![], &["/p/data"]),
            step(2, "train", vec![edge("/p/data", Some(1))], &["/p/model"]),
            step(3, "prep", vec![], &["/p/data"]),
            step(4, "eval", vec![edge("/p/model", Some(2))], &[]),
            step(5, "eval", vec![edge("/p/model", Some(2))], &[]),
        ]);
        assert_eq!(
            got,
            [
                (1, false, 0),
                (2, false, 0),
                (3, false, 0),
                (4, true, 0),
                (5, false, 1)
            ]
        );
    }
}
