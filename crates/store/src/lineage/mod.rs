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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use crate::error::{Result, StoreError};
use crate::model::{argv_from_blob, ContentHash};
use crate::query::{hash_from, Store};

mod nodes;
mod producers;
mod workers;

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
    /// Outputs counted instead of listed, when the lineage was read with
    /// [`Outputs::Collapsed`]: each directory holding that many or more of the step's outputs,
    /// with how many (those outputs are not in `outputs`). Empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_dirs: Vec<(String, usize)>,
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
/// dataset every job reads), which jobs have steps, who wrote each path read; and how it reads a
/// job's outputs.
#[derive(Default)]
struct Memo {
    never_made: HashSet<i64, Fold>,
    has_steps: HashMap<i64, bool, Fold>,
    /// Every job that wrote a path, by (path, content read there): whether it wrote that
    /// content, when it started. Ranks of a run read the same files: asked once, not per reader.
    /// By content, then path: looked up by the path's bytes, no key made.
    writers: HashMap<i64, HashMap<Vec<u8>, Vec<Writer>, Fold>, Fold>,
    outputs: Outputs,
}

/// The walk's hash maps' hasher (SipHash was ~4 % of a team-scale walk's instructions; the keys
/// are the store's own ids and paths).
type Fold = foldhash::fast::RandomState;

/// A job that wrote a path: its id, whether it wrote the content asked about, when it started.
type Writer = (i64, bool, i64);

/// How a lineage reads each job's outputs. Its inputs are always read whole: they are the walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Outputs {
    /// Every output as an [`Edge`] with its content (`--json`, exports, `reproduce`).
    #[default]
    Every,
    /// A directory holding `at` or more of a job's outputs as its count in
    /// [`Step::output_dirs`], the others as edges: what a listing that collapses such
    /// directories shows (`roar lineage`), without reading each of a dataset's 500 shards'
    /// content — at a team store's scale most of a lineage's rows are such outputs.
    Collapsed { at: usize },
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

/// What a walk read: the lineage, None when it read with several connections and a commit came
/// during it (their snapshots may differ); whether more than one connection read.
pub struct Walked {
    pub lineage: Option<Lineage>,
    pub twinned: bool,
}

/// A walk's nodes and root inputs (by path and content).
type Nodes = (BTreeMap<Node, Step>, BTreeMap<(String, String), Edge>);

/// A producer as the lookups find it: the job, and where it wrote the content when that is not
/// the location asked about.
type Producer = (i64, Option<String>);

impl Store {
    /// The jobs upstream of `target`, in the order they started, and the root inputs they start
    /// from.
    pub fn lineage(&self, target: &Version) -> Result<Lineage> {
        self.lineage_with(target, Outputs::Every)
    }

    /// [`Store::lineage`], reading each job's outputs as `outputs` says.
    pub fn lineage_with(&self, target: &Version, outputs: Outputs) -> Result<Lineage> {
        let read = |parallel| {
            self.walk(target, outputs, parallel)
                .map_err(|e| self.err(e))
        };
        match read(true)?.lineage {
            Some(lineage) => Ok(lineage),
            // A writer committed while several connections read (see `workers`).
            None => Ok(read(false)?
                .lineage
                .expect("one connection reads one snapshot")),
        }
    }

    /// The walk, level by level, on this connection alone or (`parallel`) with more for its
    /// wide levels.
    pub(crate) fn walk(
        &self,
        target: &Version,
        outputs: Outputs,
        parallel: bool,
    ) -> rusqlite::Result<Walked> {
        // One read transaction for the walk's thousands of statements (each would otherwise
        // take and drop the store's read lock); none if the caller holds one already, and then
        // one connection: the caller's snapshot may be older than another connection's.
        let own = self.conn.is_autocommit();
        let before = match parallel && own {
            true => Some(workers::data_version(&self.conn)?),
            false => None,
        };
        let read = match own {
            true => Some(self.conn.unchecked_transaction()?),
            false => None,
        };
        let mut readers = workers::Readers::new(self, outputs, before.is_some());
        let walked = self.levels(target, &mut readers);
        let twinned = readers.used_twins();
        drop(readers);
        if let Some(read) = read {
            read.commit()?;
        }
        // Connections that read different snapshots can also fail (a producer one of them
        // found that another cannot read): read again either way.
        if twinned && before != Some(workers::data_version(&self.conn)?) {
            return Ok(Walked {
                lineage: None,
                twinned,
            });
        }
        let (steps, roots) = walked?;
        // In the order they ran (the mount records a job when it ends, so ids can be out
        // of order).
        let mut steps: Vec<Step> = steps.into_values().collect();
        steps.sort_by_key(|s| (s.started_ns, s.job_id, s.step));
        let lineage = Lineage {
            target: target.hash.clone(),
            path: target.path.clone(),
            steps,
            roots: roots.into_values().collect(),
        };
        Ok(Walked {
            lineage: Some(lineage),
            twinned,
        })
    }

    /// The nodes upstream of `target`, level by level (a level: the nodes the one before points
    /// at), and the root inputs they start from.
    fn levels(&self, target: &Version, readers: &mut workers::Readers) -> rusqlite::Result<Nodes> {
        let mut steps: BTreeMap<Node, Step> = BTreeMap::new();
        let mut roots: BTreeMap<(String, String), Edge> = BTreeMap::new();
        let mut seen: HashSet<Node, Fold> = HashSet::default();
        let mut level: Vec<Node> = self.maker_node(target)?.into_iter().collect();
        while !level.is_empty() {
            level.retain(|&node| seen.insert(node));
            let mut next = Vec::new();
            for (node, step) in level.iter().zip(readers.nodes(&level)?) {
                if step.dist.is_some() {
                    next.extend(self.run_peers(node.0)?.into_iter().map(|peer| (peer, None)));
                }
                for input in &step.inputs {
                    match input.producer {
                        Some(p) => next.push((p, input.producer_step)),
                        None => {
                            let content = input.hash.as_ref().map(|h| h.blake3.clone());
                            roots
                                .entry((input.path.clone(), content.unwrap_or_default()))
                                .or_insert_with(|| input.clone());
                        }
                    }
                }
                steps.insert(*node, step);
            }
            level = next;
        }
        Ok((steps, roots))
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
            output_dirs: Vec::new(),
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
