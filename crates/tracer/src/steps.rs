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

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use roar_store::{Made, StepContent, StepFile, StepRecord};

use crate::collect::{self, Classified, HashMap};
use crate::event::Event;
use crate::ignore::Ignore;

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

/// A process as step attribution follows it.
struct Proc {
    step: usize,
    /// It exec'd since it was forked (or was first seen at an exec).
    execd: bool,
    /// The program it runs is a driver (a forked child runs its parent's until it execs).
    driver: bool,
    /// Its events before its first exec, placed once the exec says where they belong.
    pending: Vec<usize>,
}

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
/// the job is its one step. `job` is the classification of all of `events`.
pub fn steps(
    events: &[Event],
    job: &Classified,
    ctime_floor_ns: i64,
    ignore: &Ignore,
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
    let mut building = attribute(events, rule);
    if building.len() < 2 {
        return Vec::new();
    }
    let mut step_of = vec![0usize; events.len()];
    for (s, b) in building.iter_mut().enumerate() {
        b.events.sort_unstable();
        for &i in &b.events {
            step_of[i] = s;
        }
    }
    let links = Links::trace(events, &step_of);
    let job_uses: HashMap<&OsStr, roar_store::PathUse> =
        job.uses().map(|(p, u, ..)| (p.as_os_str(), u)).collect();
    let dirs = collect::made_dirs(events);
    let files: Vec<Vec<StepFile>> = building
        .iter()
        .enumerate()
        .map(|(s, b)| {
            let part = collect::classify_part(
                b.events.iter().map(|&i| &events[i]),
                &dirs,
                ctime_floor_ns,
                ignore,
            );
            step_files(s, events, &part, &links, &job_uses)
        })
        .collect();
    prune(building, files)
}

/// A process's last opens with nothing else of its own since, at most this many: the
/// redirections a shell opens for the command it is about to start.
const TAIL: usize = 8;

/// One pass over the events: which step each belongs to.
fn attribute(events: &[Event], rule: &Rule) -> Vec<Building> {
    let mut steps: Vec<Building> = Vec::new();
    let mut procs: HashMap<i32, Proc> = HashMap::default();
    // Events of processes not seen forked or exec'd yet (a vfork child, whose fork no backend
    // reports the same way), by pid.
    let mut unseen: HashMap<i32, Vec<usize>> = HashMap::default();
    // Each process's opens since its last other event (see `hand_over`).
    let mut tails: HashMap<i32, Vec<usize>> = HashMap::default();
    let new_step = |steps: &mut Vec<Building>, parent: Option<usize>, ev: &Event| -> usize {
        let Event::Exec {
            pid,
            exe,
            argv,
            cwd,
            ts_ns,
            ..
        } = ev
        else {
            unreachable!("steps begin at an exec")
        };
        steps.push(Building {
            parent,
            pid: *pid,
            exe: Some(exe.clone()),
            argv: argv.clone(),
            cwd: cwd.clone(),
            started_ns: Some(*ts_ns),
            ended_ns: None,
            streams: Default::default(),
            events: Vec::new(),
        });
        steps.len() - 1
    };
    for (i, ev) in events.iter().enumerate() {
        match ev {
            Event::Fork { pid, ppid, .. } => {
                let (step, driver) = procs.get(ppid).map_or((0, false), |p| (p.step, p.driver));
                let pending = unseen.remove(pid).unwrap_or_default();
                procs.insert(
                    *pid,
                    Proc {
                        step,
                        execd: false,
                        driver,
                        pending,
                    },
                );
            }
            Event::Exec {
                pid,
                ppid,
                exe,
                argv,
                stdio,
                ..
            } => {
                let driver_now = rule.is_driver(exe, argv);
                let mut begun = None;
                let step = match procs.get_mut(pid) {
                    Some(p) if !p.execd => {
                        // A forked child's first program: a step of its own if a driver made it.
                        let step = if steps.is_empty() {
                            new_step(&mut steps, None, ev)
                        } else if p.driver {
                            let s = new_step(&mut steps, Some(p.step), ev);
                            begun = Some(s);
                            s
                        } else {
                            p.step
                        };
                        p.step = step;
                        steps[step].events.append(&mut p.pending);
                        step
                    }
                    Some(p) => {
                        if steps[p.step].pid == *pid {
                            steps[p.step].exe = Some(exe.clone());
                        }
                        p.step
                    }
                    None => {
                        // Exec'd with no fork seen: the job's command, or a child spawned with
                        // vfork (posix_spawn), placed by its parent.
                        let step = if steps.is_empty() {
                            new_step(&mut steps, None, ev)
                        } else {
                            match procs.get(ppid) {
                                Some(parent) if parent.driver => {
                                    let parent = parent.step;
                                    let s = new_step(&mut steps, Some(parent), ev);
                                    begun = Some(s);
                                    s
                                }
                                Some(parent) => parent.step,
                                None => 0,
                            }
                        };
                        steps[step]
                            .events
                            .extend(unseen.remove(pid).unwrap_or_default());
                        procs.insert(
                            *pid,
                            Proc {
                                step,
                                execd: true,
                                driver: driver_now,
                                pending: Vec::new(),
                            },
                        );
                        step
                    }
                };
                if let Some(new) = begun {
                    if let Some(tail) = tails.get_mut(ppid) {
                        hand_over(events, &mut steps, new, tail, stdio);
                    }
                    steps[new].streams = redirections(events, &steps[new].events, stdio);
                }
                tails.remove(pid);
                let p = procs.get_mut(pid).expect("inserted above");
                p.execd = true;
                p.driver = driver_now;
                steps[step].events.push(i);
            }
            Event::Exit { pid, ts_ns } => {
                tails.remove(pid);
                if let Some(mut p) = procs.remove(pid).filter(|_| !steps.is_empty()) {
                    steps[p.step].events.append(&mut p.pending);
                    if steps[p.step].pid == *pid && p.execd {
                        steps[p.step].ended_ns = Some(*ts_ns);
                    }
                }
            }
            other => {
                let pid = event_pid(other);
                if matches!(other, Event::Open { .. }) {
                    let tail = tails.entry(pid).or_default();
                    if tail.len() == TAIL {
                        tail.remove(0);
                    }
                    tail.push(i);
                } else {
                    tails.remove(&pid);
                }
                match procs.get_mut(&pid) {
                    Some(p) if !p.execd => p.pending.push(i),
                    Some(p) if !steps.is_empty() => steps[p.step].events.push(i),
                    Some(p) => p.pending.push(i),
                    None => unseen.entry(pid).or_default().push(i),
                }
            }
        }
    }
    if steps.is_empty() {
        return steps;
    }
    // Still running at the end (orphans the tracer stopped following), or never placed.
    for (_, mut p) in procs {
        steps[p.step].events.append(&mut p.pending);
    }
    for (_, evs) in unseen {
        steps[0].events.extend(evs);
    }
    steps
}

/// A file handed to a new step as a standard stream by the process that started it is the new
/// step's, whoever opened it: dash opens the redirections of `sort a > b` itself and then vforks
/// sort, Python opens `stdout=open("b", "w")` for `subprocess.run`. The parent's open is moved
/// to the new step when it is among the parent's last opens with nothing else of its own since
/// (`tail`), has the identity of one of the new program's streams, and the new step did not open
/// that file itself before its exec (bash opens redirections in the child: nothing to move). One
/// open per stream, the latest: an earlier one of the same file was the parent's own.
fn hand_over(
    events: &[Event],
    steps: &mut [Building],
    new: usize,
    tail: &mut Vec<usize>,
    stdio: &crate::event::Stdio,
) {
    let identity = |i: usize| match &events[i] {
        Event::Open { stat: Some(st), .. } => Some((st.dev, st.ino)),
        _ => None,
    };
    let own: Vec<(u64, u64)> = steps[new]
        .events
        .iter()
        .filter_map(|&i| identity(i))
        .collect();
    let parent = steps[new].parent.expect("a new step has a parent");
    let mut wanted: Vec<(u64, u64)> = stdio
        .iter()
        .flatten()
        .copied()
        .filter(|id| !own.contains(id))
        .collect();
    wanted.dedup();
    for k in (0..tail.len()).rev() {
        let Some(id) = identity(tail[k]) else {
            continue;
        };
        let Some(w) = wanted.iter().position(|x| *x == id) else {
            continue;
        };
        wanted.swap_remove(w);
        let i = tail.remove(k);
        if let Some(at) = steps[parent].events.iter().rposition(|&e| e == i) {
            steps[parent].events.remove(at);
            steps[new].events.push(i);
        }
    }
}

/// The new step's standard streams that are files opened for it before its exec (`events`, its
/// own and those handed over): what a re-run must redirect. A stream it inherited from further up
/// (the job's own `> log`) is none of its redirections.
fn redirections(
    events: &[Event],
    own: &[usize],
    stdio: &crate::event::Stdio,
) -> [Option<roar_store::Redirect>; 3] {
    stdio.map(|id| {
        let id = id?;
        own.iter().rev().find_map(|&i| match &events[i] {
            Event::Open {
                path,
                flags,
                stat: Some(st),
                ..
            } if (st.dev, st.ino) == id => Some(roar_store::Redirect {
                path: path.clone(),
                append: flags & libc::O_APPEND != 0,
            }),
            _ => None,
        })
    })
}

fn event_pid(ev: &Event) -> i32 {
    match ev {
        Event::Exec { pid, .. }
        | Event::Fork { pid, .. }
        | Event::Exit { pid, .. }
        | Event::Open { pid, .. }
        | Event::Rename { pid, .. }
        | Event::Link { pid, .. }
        | Event::Unlink { pid, .. }
        | Event::Truncate { pid, .. }
        | Event::Mkdir { pid, .. }
        | Event::Rmdir { pid, .. }
        | Event::Exchange { pid, .. }
        | Event::Symlink { pid, .. }
        | Event::Untraced { pid, .. } => *pid,
    }
}

/// Who wrote what when, across the job's steps.
struct Links<'e> {
    /// The last change to each path: the step that made it, the event's index, and whether the
    /// path existed after it (not after an unlink or a rename away).
    last_change: HashMap<&'e OsStr, (usize, usize, bool)>,
    /// For each (step, path), the step's first touch: the event's index, and the step that had
    /// last changed the path by then, if that change left content there.
    first_touch: HashMap<(usize, &'e OsStr), (usize, Option<usize>)>,
}

impl<'e> Links<'e> {
    fn trace(events: &'e [Event], step_of: &[usize]) -> Links<'e> {
        let mut links = Links {
            last_change: HashMap::default(),
            first_touch: HashMap::default(),
        };
        for (i, ev) in events.iter().enumerate() {
            let s = step_of[i];
            // (path, what a change left there: Some(exists), None for a mere touch)
            let paths: Vec<(&Path, Option<bool>)> = match ev {
                Event::Open { path, flags, .. } => {
                    let acc = flags & libc::O_ACCMODE;
                    let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
                    vec![(path.as_path(), writes.then_some(true))]
                }
                Event::Rename { from, to, .. } => {
                    vec![(from.as_path(), Some(false)), (to.as_path(), Some(true))]
                }
                Event::Exchange { a, b, .. } => {
                    vec![(a.as_path(), Some(true)), (b.as_path(), Some(true))]
                }
                Event::Link { from, to, .. } => {
                    vec![(from.as_path(), None), (to.as_path(), Some(true))]
                }
                Event::Unlink { path, .. } => vec![(path.as_path(), Some(false))],
                Event::Truncate { path, .. } | Event::Symlink { path, .. } => {
                    vec![(path.as_path(), Some(true))]
                }
                _ => continue,
            };
            for &(p, _) in &paths {
                let writer = links
                    .last_change
                    .get(p.as_os_str())
                    .filter(|w| w.2)
                    .map(|w| w.0);
                links
                    .first_touch
                    .entry((s, p.as_os_str()))
                    .or_insert((i, writer));
            }
            for (p, change) in paths {
                if let Some(exists) = change {
                    links.last_change.insert(p.as_os_str(), (s, i, exists));
                }
            }
        }
        links
    }
}

/// The files of step `s`, from the classification of its own events.
///
/// One fact the classification of a step's events alone cannot know: that a file it first
/// touched by writing without truncating (`>>`, an in-place update) held another step's content.
/// The job's rule judges such bytes by the file's ctime against the job's start, which says
/// nothing between steps; here the order of events does: content another step left there is
/// kept by the write, so it is an input from that step.
fn step_files(
    s: usize,
    events: &[Event],
    part: &Classified,
    links: &Links,
    job: &HashMap<&OsStr, roar_store::PathUse>,
) -> Vec<StepFile> {
    let mut files = Vec::new();
    for (path, used, ops, first_ns, last_ns) in part.uses() {
        let key = path.as_os_str();
        let job_use = job.get(key).copied().unwrap_or_default();
        let job_output = job_use.records().1 == Some(Made::Output);
        let (mut input, made) = used.records();
        if let Some(&(at, Some(_))) = links.first_touch.get(&(s, key)) {
            if let Event::Open { flags, .. } = &events[at] {
                let acc = flags & libc::O_ACCMODE;
                input |=
                    (acc == libc::O_WRONLY || acc == libc::O_RDWR) && flags & libc::O_TRUNC == 0;
            }
        }
        let file = |role, from_step, content| StepFile {
            path: path.to_owned(),
            role,
            ops,
            from_step,
            content,
            first_ns: Some(first_ns),
            last_ns: Some(last_ns),
        };
        if input {
            let (touched_at, writer) = links
                .first_touch
                .get(&(s, key))
                .copied()
                .unwrap_or((usize::MAX, None));
            let writer = writer.filter(|&w| w != s);
            let unchanged_since = links
                .last_change
                .get(key)
                .is_none_or(|&(_, at, _)| at < touched_at);
            let content = match writer {
                None if job_use.read_prior => StepContent::Prior,
                Some(_) if unchanged_since && job_output => StepContent::Final,
                _ => StepContent::Unknown,
            };
            files.push(file(
                roar_store::Role::Input,
                writer.map(|w| w as u32),
                content,
            ));
        }
        let last_by_me = links.last_change.get(key).is_some_and(|&(w, ..)| w == s);
        match made {
            Some(Made::Output) => {
                let content = if last_by_me && job_output {
                    StepContent::Final
                } else {
                    StepContent::Unknown
                };
                files.push(file(roar_store::Role::Output, None, content));
            }
            Some(Made::Deleted) => {
                files.push(file(roar_store::Role::Output, None, StepContent::Unknown))
            }
            Some(Made::Temp) => {
                files.push(file(roar_store::Role::Temp, None, StepContent::Unknown))
            }
            None => {}
        }
    }
    files
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
    let mut keep = vec![false; n];
    keep[0] = true;
    // Children come after their parents: one pass from the end settles every subtree.
    for s in (1..n).rev() {
        if !files[s].is_empty() || keep[s] {
            keep[s] = true;
            if let Some(p) = building[s].parent {
                keep[p] = true;
            }
        }
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for s in 1..n {
        if keep[s] {
            children[building[s].parent.expect("only the root has none")].push(s);
        }
    }
    // Where each step's files went (itself, or the step it was folded into).
    let mut into: Vec<usize> = (0..n).collect();
    for s in 0..n {
        while keep[s] && files[s].is_empty() && children[s].len() == 1 {
            let c = children[s].pop().expect("one child");
            keep[c] = false;
            into[c] = s;
            files[s] = std::mem::take(&mut files[c]);
            let grandchildren = std::mem::take(&mut children[c]);
            for &g in &grandchildren {
                building[g].parent = Some(s);
            }
            children[s] = grandchildren;
            let inner = building[c].exe.take();
            building[s].exe = inner.or(building[s].exe.take());
            building[s].ended_ns = building[s].ended_ns.max(building[c].ended_ns);
        }
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
    // A folded step's number is the step it was folded into (folds only go up the tree).
    let number = |mut s: usize| {
        while into[s] != s {
            s = into[s];
        }
        seq[s]
    };
    let numbers: Vec<u32> = (0..n).map(number).collect();
    building
        .into_iter()
        .enumerate()
        .filter(|(s, _)| keep[*s])
        .map(|(s, b)| {
            let mut files = std::mem::take(&mut files[s]);
            for f in &mut files {
                // A writer is never dropped: it has the file (at most, it was folded).
                f.from_step = f.from_step.map(|w| numbers[w as usize]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use roar_store::Role;

    const D: &str = "/nonexistent-roar-steps";

    fn p(name: &str) -> PathBuf {
        Path::new(D).join(name)
    }

    fn exec(pid: i32, ppid: i32, argv: &[&str], ts_ns: i64) -> Event {
        Event::Exec {
            pid,
            ppid,
            exe: PathBuf::from(format!("/usr/bin/{}", argv[0])),
            argv: argv.iter().map(OsString::from).collect(),
            cwd: PathBuf::from(D),
            stdio: [None; 3],
            ts_ns,
        }
    }

    fn fork(pid: i32, ppid: i32, ts_ns: i64) -> Event {
        Event::Fork { pid, ppid, ts_ns }
    }

    fn read(pid: i32, name: &str, ts_ns: i64) -> Event {
        Event::Open {
            pid,
            path: p(name),
            flags: libc::O_RDONLY,
            stat: None,
            ts_ns,
        }
    }

    fn write(pid: i32, name: &str, ts_ns: i64) -> Event {
        Event::Open {
            pid,
            path: p(name),
            flags: libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            stat: None,
            ts_ns,
        }
    }

    fn steps_of(events: &[Event], rule: &Rule) -> Vec<StepRecord> {
        let ignore = Ignore::new(&[]);
        let job = collect::classify(events, 0, &ignore);
        steps(events, &job, 0, &ignore, rule)
    }

    /// (seq, parent, argv[0]) of each step, and (seq, role, name, from_step, content) per file.
    type Files = Vec<(u32, Role, String, Option<u32>, StepContent)>;

    fn shape(steps: &[StepRecord]) -> (Vec<(u32, Option<u32>, String)>, Files) {
        let tree = steps
            .iter()
            .map(|s| (s.seq, s.parent, s.argv[0].to_string_lossy().into_owned()))
            .collect();
        let files = steps
            .iter()
            .flat_map(|s| {
                s.files.iter().map(move |f| {
                    let name = f.path.file_name().unwrap().to_string_lossy().into_owned();
                    (s.seq, f.role, name, f.from_step, f.content)
                })
            })
            .collect();
        (tree, files)
    }

    #[test]
    fn a_script_is_cut_into_its_commands_and_redirections_belong_to_the_command() {
        // bash s.sh: `sort a > b; cat b > c; rm b` (the shell opens each redirection in the child).
        let events = [
            exec(1, 0, &["bash", "s.sh"], 1),
            read(1, "s.sh", 2),
            fork(2, 1, 3),
            write(2, "b", 4),
            exec(2, 1, &["sort", "a"], 5),
            read(2, "a", 6),
            Event::Exit { pid: 2, ts_ns: 7 },
            fork(3, 1, 8),
            write(3, "c", 9),
            exec(3, 1, &["cat", "b"], 10),
            read(3, "b", 11),
            Event::Exit { pid: 3, ts_ns: 12 },
            fork(4, 1, 13),
            exec(4, 1, &["rm", "b"], 14),
            Event::Unlink {
                pid: 4,
                path: p("b"),
                ts_ns: 15,
            },
        ];
        let (tree, files) = shape(&steps_of(&events, &Rule::default()));
        assert_eq!(
            tree,
            [
                (1, None, "bash".into()),
                (2, Some(1), "sort".into()),
                (3, Some(1), "cat".into()),
                (4, Some(1), "rm".into()),
            ]
        );
        use StepContent::*;
        assert_eq!(
            files,
            [
                (1, Role::Input, "s.sh".into(), None, Prior),
                (2, Role::Output, "b".into(), None, Unknown),
                (2, Role::Input, "a".into(), None, Prior),
                (3, Role::Output, "c".into(), None, Final),
                (3, Role::Input, "b".into(), Some(2), Unknown),
                (4, Role::Output, "b".into(), None, Unknown),
            ]
        );
    }

    #[test]
    fn forked_workers_stay_in_their_step_and_non_drivers_do_not_begin_steps() {
        // python train.py with a dataloader worker (fork, no exec): one step, so none recorded.
        let events = [
            exec(1, 0, &["python3", "train.py"], 1),
            fork(2, 1, 2),
            read(2, "shard0", 3),
            read(1, "shard1", 4),
            write(1, "model", 5),
        ];
        assert!(steps_of(&events, &Rule::default()).is_empty());
        // make spawns gcc (vfork: no fork event), gcc runs cc1 and as: all in gcc's step.
        let events = [
            exec(1, 0, &["make"], 1),
            read(1, "Makefile", 2),
            exec(2, 1, &["gcc", "-c", "x.c"], 3),
            fork(3, 2, 4),
            exec(3, 2, &["cc1", "x.c"], 5),
            read(3, "x.c", 6),
            write(3, "x.s", 7),
            Event::Exit { pid: 3, ts_ns: 8 },
            fork(4, 2, 9),
            exec(4, 2, &["as", "x.s"], 10),
            read(4, "x.s", 11),
            write(4, "x.o", 12),
        ];
        let (tree, files) = shape(&steps_of(&events, &Rule::default()));
        assert_eq!(tree, [(1, None, "make".into()), (2, Some(1), "gcc".into())]);
        let names: Vec<(u32, Role, &str)> = files
            .iter()
            .map(|(s, r, n, ..)| (*s, *r, n.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (1, Role::Input, "Makefile"),
                (2, Role::Input, "x.c"),
                (2, Role::Output, "x.s"),
                (2, Role::Output, "x.o"),
            ]
        );
        // No drivers: every job is one step.
        assert!(steps_of(&events, &Rule::new([])).is_empty());
    }

    #[test]
    fn a_step_with_one_step_below_and_no_files_of_its_own_is_folded_into_it() {
        // make runs `sh -c 'sort a > b'` and `time sh -c 'cat b > c'`; each shell forks its
        // command rather than exec'ing it.
        let events = [
            exec(1, 0, &["make"], 1),
            read(1, "Makefile", 2),
            exec(2, 1, &["sh", "-c", "sort a > b"], 3),
            fork(3, 2, 4),
            write(3, "b", 5),
            exec(3, 2, &["sort", "a"], 6),
            read(3, "a", 7),
            Event::Exit { pid: 3, ts_ns: 8 },
            Event::Exit { pid: 2, ts_ns: 9 },
            exec(4, 1, &["time", "sh", "-c", "cat b > c"], 10),
            fork(5, 4, 11),
            exec(5, 4, &["sh", "-c", "cat b > c"], 12),
            fork(6, 5, 13),
            write(6, "c", 14),
            exec(6, 5, &["cat", "b"], 15),
            read(6, "b", 16),
        ];
        let steps = steps_of(&events, &Rule::default());
        let (tree, files) = shape(&steps);
        assert_eq!(
            tree,
            [
                (1, None, "make".into()),
                (2, Some(1), "sh".into()),
                (3, Some(1), "time".into()),
            ]
        );
        assert_eq!(steps[1].exe, Some(PathBuf::from("/usr/bin/sort")));
        assert_eq!(steps[2].exe, Some(PathBuf::from("/usr/bin/cat")));
        assert!(files.contains(&(3, Role::Input, "b".into(), Some(2), StepContent::Final)));
        // A job whose command only wraps one other (`time python t.py`) is one step.
        let events = [
            exec(1, 0, &["time", "python", "t.py"], 1),
            fork(2, 1, 2),
            exec(2, 1, &["python", "t.py"], 3),
            write(2, "m", 4),
        ];
        assert!(steps_of(&events, &Rule::default()).is_empty());
    }

    #[test]
    fn appending_to_another_steps_file_reads_it_but_not_after_it_was_removed() {
        // sh -c 'wc -l t > r && cat s >> r; rm x; cat s >> x'
        let append = |pid, name: &str, ts_ns| Event::Open {
            pid,
            path: p(name),
            flags: libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            stat: None,
            ts_ns,
        };
        let events = [
            exec(1, 0, &["sh", "-c", "..."], 1),
            read(1, "x", 2),
            exec(2, 1, &["wc", "-l", "t"], 3),
            write(2, "r", 4),
            read(2, "t", 5),
            exec(3, 1, &["cat", "s"], 6),
            append(3, "r", 7),
            read(3, "s", 8),
            exec(4, 1, &["rm", "x"], 9),
            Event::Unlink {
                pid: 4,
                path: p("x"),
                ts_ns: 10,
            },
            exec(5, 1, &["cat", "s"], 11),
            append(5, "x", 12),
            read(5, "s", 13),
        ];
        let (_, files) = shape(&steps_of(&events, &Rule::default()));
        assert!(files.contains(&(3, Role::Input, "r".into(), Some(2), StepContent::Unknown)));
        assert!(files.contains(&(3, Role::Output, "r".into(), None, StepContent::Final)));
        assert!(!files
            .iter()
            .any(|f| f.0 == 5 && f.1 == Role::Input && f.2 == "x"));
    }

    #[test]
    fn a_step_that_touched_nothing_is_dropped_and_numbers_close_up() {
        // python drive.py runs `uname` (no files), then `prep` and `train` by subprocess.
        let events = [
            exec(1, 0, &["python3", "drive.py"], 1),
            exec(2, 1, &["uname", "-m"], 2),
            Event::Exit { pid: 2, ts_ns: 3 },
            exec(3, 1, &["prep"], 4),
            write(3, "x", 5),
            Event::Exit { pid: 3, ts_ns: 6 },
            exec(4, 1, &["train"], 7),
            read(4, "x", 8),
            write(4, "m", 9),
        ];
        let (tree, files) = shape(&steps_of(&events, &Rule::default()));
        assert_eq!(
            tree,
            [
                (1, None, "python3".into()),
                (2, Some(1), "prep".into()),
                (3, Some(1), "train".into()),
            ]
        );
        assert!(files.contains(&(3, Role::Input, "x".into(), Some(2), StepContent::Final)));
    }

    #[test]
    fn an_exec_in_place_keeps_the_step_and_its_command() {
        // make runs `sh -c 'env X=1 python t.py'`; sh execs env, env execs python, whose
        // subprocess begins a step of its own.
        let events = [
            exec(1, 0, &["make"], 1),
            read(1, "Makefile", 1),
            exec(2, 1, &["sh", "-c", "env X=1 python t.py"], 2),
            exec(2, 1, &["env", "X=1", "python", "t.py"], 3),
            exec(2, 1, &["python", "t.py"], 4),
            write(2, "log", 5),
            exec(3, 2, &["tool"], 6),
            write(3, "out", 7),
        ];
        let steps = steps_of(&events, &Rule::default());
        let (tree, _) = shape(&steps);
        assert_eq!(
            tree,
            [
                (1, None, "make".into()),
                (2, Some(1), "sh".into()),
                (3, Some(2), "tool".into()),
            ]
        );
        assert_eq!(steps[1].exe, Some(PathBuf::from("/usr/bin/python")));
    }
}
