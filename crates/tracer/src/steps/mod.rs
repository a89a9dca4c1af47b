//! Steps: a job's process tree cut into the commands a user would name (SEMANTICS.md "Steps").
//!
//! The job's command is its root step. A process that a *driver* forked and that then exec'd a
//! program begins a new step, a child of the step of the process that forked it. Every other
//! process stays in the step of the process that made it: one forked without exec (dataloader
//! and multiprocessing workers, a shell's subshell) or exec'd by a program that is not a driver
//! (a compiler's cc1, as and ld). A driver is a program that runs other programs for its user:
//! shells, make, xargs, env, nohup, time, Python... ([`DEFAULT_DRIVERS`], `[steps] drivers` in
//! the config). A process that execs again stays the step it is (`sh -c 'sort a'` exec'ing sort,
//! `env X=1 python t.py` exec'ing python); whether its own children begin steps follows the
//! program it runs now.
//!
//! A command's redirections are its files: what a forked child does before its exec belongs to
//! the step the exec begins (bash opens the redirection of `sort a > b` in the child that then
//! execs sort), and a file the driver itself opened and handed over as one of the new program's
//! standard streams moves to the new step ([`hand_over`]: dash opens it in the shell, then
//! vforks; a Python driver passes `stdout=open(...)`).
//!
//! Each step's events are classified by the job's own rules ([`collect`]), so a step's inputs and
//! outputs mean what a job's do. Intermediate files link steps directly, by the order of events:
//! a step's input comes from the step that last wrote the path before this step first touched it
//! (`from_step`). Contents are the job's: a step file is either the job's prior content of the
//! path, the job's final content, or a state in between that was never hashed.

mod attribute;
mod links;
#[cfg(test)]
mod tests;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use roar_store::{StepFile, StepRecord};

use crate::collect::{self, Classified, HashMap};
use crate::event::Event;

/// Programs whose children begin steps. A trailing `*` matches any rest of the name
/// (`python*`: python3, python3.12).
pub const DEFAULT_DRIVERS: &[&str] = &[
    // Shells.
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "fish",
    "busybox",
    // Build and pipeline runners.
    "make",
    "gmake",
    "ninja",
    "snakemake",
    "dvc",
    "nextflow",
    "just",
    // Launchers that run a command they are given.
    "env",
    "nohup",
    "time",
    "timeout",
    "nice",
    "ionice",
    "stdbuf",
    "taskset",
    "setsid",
    "chrt",
    "xargs",
    "parallel",
    "flock",
    "strace",
    // Python drivers (`subprocess.run` per stage).
    "python*",
];

/// Which programs begin steps for the processes they start.
#[derive(Debug, Clone)]
pub struct Rule {
    drivers: Vec<String>,
}

impl Default for Rule {
    fn default() -> Rule {
        Rule::new(DEFAULT_DRIVERS.iter().copied())
    }
}

impl Rule {
    /// A rule with these driver names; an empty list means a job is always one step.
    pub fn new<'a>(drivers: impl IntoIterator<Item = &'a str>) -> Rule {
        Rule {
            drivers: drivers.into_iter().map(str::to_owned).collect(),
        }
    }

    /// Whether the program a process runs is a driver, by the name of its executable or of its
    /// argv[0] (a script exec'd through its `#!` line shows the script as either, depending on the
    /// backend, and the interpreter as the other).
    fn is_driver(&self, exe: &Path, argv: &[OsString]) -> bool {
        let name = |p: &OsStr| -> Option<String> {
            Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        };
        [name(exe.as_os_str()), argv.first().and_then(|a| name(a))]
            .into_iter()
            .flatten()
            .any(|n| {
                self.drivers.iter().any(|d| match d.strip_suffix('*') {
                    Some(prefix) => n.starts_with(prefix),
                    None => n == *d,
                })
            })
    }
}

/// A step being put together: where it sits, its command, and the indices of its events.
struct Building {
    parent: Option<usize>,
    pid: i32,
    exe: Option<PathBuf>,
    argv: Vec<OsString>,
    cwd: PathBuf,
    started_ns: Option<i64>,
    ended_ns: Option<i64>,
    streams: [Option<roar_store::Redirect>; 3],
    events: Vec<usize>,
}

/// The job's steps with their files, root first, when its command started more than one step
/// that touched a tracked file (or left an empty child between two that did); otherwise none:
/// the job is its one step. `job` is the classification of all of `events` (its verdicts on
/// which paths are ignored are reused).
pub fn steps(
    events: &[Event],
    job: &Classified,
    ctime_floor_ns: i64,
    rule: &Rule,
) -> Vec<StepRecord> {
    // A job with one exec cannot have two steps: no second pass over its events.
    let execs = events
        .iter()
        .filter(|e| matches!(e, Event::Exec { .. }))
        .take(2)
        .count();
    if execs < 2 || rule.drivers.is_empty() {
        return Vec::new();
    }
    let mut building = attribute::attribute(events, rule);
    // Every path of the job's events was judged when the job was classified: ignored or not.
    let ignored: collect::HashSet<&OsStr> = job.environment.iter().map(|p| p.as_os_str()).collect();
    // Most jobs with a second exec are still one step (a wrapper script around one program, a
    // `uname` Python ran): known from which steps touched a tracked path, before any step's
    // events are classified (which would be the job's classification a second time).
    let tracked: Vec<bool> = building
        .iter()
        .map(|b| {
            b.events.iter().any(|&i| {
                links::touched(&events[i])
                    .into_iter()
                    .flatten()
                    .any(|(p, _)| !ignored.contains(p.as_os_str()))
            })
        })
        .collect();
    let mut parents: Vec<Option<usize>> = building.iter().map(|b| b.parent).collect();
    if shape(&mut parents, &tracked)
        .keep
        .iter()
        .filter(|k| **k)
        .count()
        < 2
    {
        return Vec::new();
    }
    let mut step_of = vec![0usize; events.len()];
    for (s, b) in building.iter_mut().enumerate() {
        b.events.sort_unstable();
        for &i in &b.events {
            step_of[i] = s;
        }
    }
    let links = links::Links::trace(events, &step_of);
    let job_uses: HashMap<&OsStr, roar_store::PathUse> =
        job.uses().map(|(p, u, ..)| (p.as_os_str(), u)).collect();
    let dirs = collect::made_dirs(events);
    let judge = collect::Judge::Known(&ignored);
    let files: Vec<Vec<StepFile>> = building
        .iter()
        .enumerate()
        .map(|(s, b)| {
            let part = collect::classify_part(
                b.events.iter().map(|&i| &events[i]),
                &dirs,
                ctime_floor_ns,
                &judge,
            );
            links::step_files(s, events, &part, &links, &job_uses)
        })
        .collect();
    prune(building, files)
}

/// Drops steps that touched no tracked file and have no step below them (a `uname` a Python
/// program ran, an `echo` of a script): their processes stay in the job's process list. Then
/// folds a step that touched nothing itself and has one step below it into that step (`sh -c
/// 'sort a > b'` whose shell forked sort rather than exec'ing it, `time cmd`, `timeout 9 cmd`):
/// the step keeps the outer command (what its driver ran, so what a re-run runs) and takes the
/// inner program and its files. Numbers the rest in order, 1 for the root. None are left when
/// the job is its one step.
fn prune(mut building: Vec<Building>, mut files: Vec<Vec<StepFile>>) -> Vec<StepRecord> {
    let n = building.len();
    let has_files: Vec<bool> = files.iter().map(|f| !f.is_empty()).collect();
    let mut parents: Vec<Option<usize>> = building.iter().map(|b| b.parent).collect();
    let Shape { keep, into } = shape(&mut parents, &has_files);
    // Folds go up the tree, outer before inner: the innermost program is the step's last.
    for c in 0..n {
        let t = resolve(&into, c);
        if t == c {
            continue;
        }
        let moved = std::mem::take(&mut files[c]);
        if !moved.is_empty() {
            files[t] = moved;
        }
        let inner = building[c].exe.take();
        building[t].exe = inner.or(building[t].exe.take());
        building[t].ended_ns = building[t].ended_ns.max(building[c].ended_ns);
    }
    for (b, p) in building.iter_mut().zip(parents) {
        b.parent = p;
    }
    let mut seq = vec![0u32; n];
    let mut next = 0;
    for s in 0..n {
        if keep[s] {
            next += 1;
            seq[s] = next;
        }
    }
    if next < 2 {
        return Vec::new();
    }
    // A folded step's number is the step it was folded into.
    let numbers: Vec<u32> = (0..n).map(|s| seq[resolve(&into, s)]).collect();
    building
        .into_iter()
        .enumerate()
        .filter(|(s, _)| keep[*s])
        .map(|(s, b)| {
            let mut files = std::mem::take(&mut files[s]);
            for f in &mut files {
                // A writer has the file, so it is kept or folded; a change no step's files show
                // (inside a directory moved as a whole) links nothing.
                f.from_step = f.from_step.map(|w| numbers[w as usize]).filter(|&n| n != 0);
            }
            StepRecord {
                seq: seq[s],
                parent: b.parent.map(|p| numbers[p]),
                pid: b.pid,
                exe: b.exe,
                argv: b.argv,
                cwd: b.cwd,
                started_ns: b.started_ns,
                ended_ns: b.ended_ns,
                streams: b.streams,
                files,
            }
        })
        .collect()
}

/// Which steps stay (see [`prune`]), and where each step's files go: itself, or the step it is
/// folded into.
struct Shape {
    keep: Vec<bool>,
    into: Vec<usize>,
}

/// [`prune`]'s decisions from which steps have files; `parents` is updated for the folds (a
/// folded step's children become its parent's).
fn shape(parents: &mut [Option<usize>], has_files: &[bool]) -> Shape {
    let n = parents.len();
    let mut keep = vec![false; n];
    keep[0] = true;
    // Children come after their parents: one pass from the end settles every subtree.
    for s in (1..n).rev() {
        if has_files[s] || keep[s] {
            keep[s] = true;
            if let Some(p) = parents[s] {
                keep[p] = true;
            }
        }
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for s in 1..n {
        if keep[s] {
            children[parents[s].expect("only the root has none")].push(s);
        }
    }
    let mut into: Vec<usize> = (0..n).collect();
    let mut files = has_files.to_vec();
    for s in 0..n {
        while keep[s] && !files[s] && children[s].len() == 1 {
            let c = children[s].pop().expect("one child");
            keep[c] = false;
            into[c] = s;
            files[s] = files[c];
            let grandchildren = std::mem::take(&mut children[c]);
            for &g in &grandchildren {
                parents[g] = Some(s);
            }
            children[s] = grandchildren;
        }
    }
    Shape { keep, into }
}

/// The step `s`'s files went to, following folds.
fn resolve(into: &[usize], mut s: usize) -> usize {
    while into[s] != s {
        s = into[s];
    }
    s
}
