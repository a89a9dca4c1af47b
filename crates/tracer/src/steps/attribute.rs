//! Which step each event belongs to (the rule is in the parent module's doc): drivers, exec in place, a forked
//! child's pre-exec events, and streams handed over.

use super::{Building, Rule};
use crate::collect::HashMap;
use crate::event::Event;

/// A process as step attribution follows it.
struct Proc {
    step: usize,
    /// The process that made it (a pid seen again with another parent is a reused pid).
    ppid: i32,
    /// It exec'd since it was forked (or was first seen at an exec).
    execd: bool,
    /// The program it runs is a driver (a forked child runs its parent's until it execs).
    driver: bool,
    /// Its events before its first exec, placed once the exec says where they belong.
    pending: Vec<usize>,
}

/// A process's last opens with nothing else of its own since, at most this many: the
/// redirections a shell opens for the command it is about to start.
const TAIL: usize = 8;

/// One pass over the events: which step each belongs to.
pub(super) fn attribute(events: &[Event], rule: &Rule) -> Vec<Building> {
    let mut a = Attribution {
        events,
        rule,
        steps: Vec::new(),
        procs: HashMap::default(),
        unseen: HashMap::default(),
        tails: HashMap::default(),
        outside: Vec::new(),
    };
    for (i, ev) in events.iter().enumerate() {
        match ev {
            Event::Fork { pid, ppid, .. } => a.forked(*pid, *ppid),
            Event::Exec { .. } => a.execed(i, ev),
            Event::Exit { pid, ts_ns } => a.exited(*pid, *ts_ns),
            other => a.other(i, other),
        }
    }
    a.finish()
}

/// The state of [`attribute`]'s pass.
struct Attribution<'e> {
    events: &'e [Event],
    rule: &'e Rule,
    steps: Vec<Building>,
    procs: HashMap<i32, Proc>,
    /// Events of processes not seen forked or exec'd yet (a vfork child, whose fork no backend
    /// reports the same way), by pid.
    unseen: HashMap<i32, Vec<usize>>,
    /// Each process's opens since its last other event (see `hand_over`).
    tails: HashMap<i32, Vec<usize>>,
    /// The job's own pipes to the world (the root's stdin, stdout, stderr at its exec).
    outside: Vec<(u64, u64)>,
}

impl Attribution<'_> {
    /// A step that begins at the exec `ev`, below `parent`.
    fn new_step(&mut self, parent: Option<usize>, ev: &Event) -> usize {
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
        self.steps.push(Building {
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
        self.steps.len() - 1
    }

    fn forked(&mut self, pid: i32, ppid: i32) {
        if self.procs.get(&pid).is_some_and(|p| p.ppid == ppid) {
            // The fork of a process already seen: ptrace can see a vfork child's exec before its
            // parent's vfork stop says it was forked.
            return;
        }
        let (step, driver) = (self.procs.get(&ppid)).map_or((0, false), |p| (p.step, p.driver));
        let pending = self.unseen.remove(&pid).unwrap_or_default();
        self.procs.insert(
            pid,
            Proc {
                step,
                ppid,
                execd: false,
                driver,
                pending,
            },
        );
    }

    /// The exec at `i`: the step it belongs to, or begins.
    fn execed(&mut self, i: usize, ev: &Event) {
        let Event::Exec {
            pid,
            ppid,
            exe,
            argv,
            stdio,
            pipes,
            ..
        } = ev
        else {
            unreachable!("called for execs")
        };
        let driver_now = self.rule.is_driver(exe, argv);
        if self.steps.is_empty() {
            self.outside = pipes.iter().flatten().copied().collect();
        }
        // A program whose data reaches another of the job's programs through a pipe is no step
        // of its own (see `bound`).
        let own_step = !bound(argv, pipes, &self.outside);
        let (step, begun) = match self.procs.get(pid).map(|p| p.execd) {
            Some(false) => self.first_exec(*pid, ev, own_step),
            Some(true) => {
                let step = self.procs[pid].step;
                if self.steps[step].pid == *pid {
                    self.steps[step].exe = Some(exe.clone());
                }
                (step, None)
            }
            None => self.exec_unforked(*pid, *ppid, ev, own_step, driver_now),
        };
        if let Some(new) = begun {
            if let Some(tail) = self.tails.get_mut(ppid) {
                hand_over(self.events, &mut self.steps, new, tail, stdio);
            }
            self.steps[new].streams = redirections(self.events, &self.steps[new].events, stdio);
        }
        self.tails.remove(pid);
        let p = self.procs.get_mut(pid).expect("inserted above");
        p.execd = true;
        p.driver = driver_now;
        self.steps[step].events.push(i);
    }

    /// A forked child's first program: a step of its own if a driver made it. The step, and
    /// whether it begins here.
    fn first_exec(&mut self, pid: i32, ev: &Event, own_step: bool) -> (usize, Option<usize>) {
        let (parent_step, driver) = (self.procs[&pid].step, self.procs[&pid].driver);
        let (step, begun) = if self.steps.is_empty() {
            (self.new_step(None, ev), None)
        } else if driver && own_step {
            let s = self.new_step(Some(parent_step), ev);
            (s, Some(s))
        } else {
            (parent_step, None)
        };
        let p = self.procs.get_mut(&pid).expect("seen forked");
        p.step = step;
        self.steps[step].events.append(&mut p.pending);
        (step, begun)
    }

    /// Exec'd with no fork seen: the job's command, or a child spawned with vfork
    /// (posix_spawn), placed by its parent. The step, and whether it begins here.
    fn exec_unforked(
        &mut self,
        pid: i32,
        ppid: i32,
        ev: &Event,
        own_step: bool,
        driver_now: bool,
    ) -> (usize, Option<usize>) {
        let mut begun = None;
        let step = if self.steps.is_empty() {
            self.new_step(None, ev)
        } else {
            match self.procs.get(&ppid).map(|p| (p.driver, p.step)) {
                Some((true, parent)) if own_step => {
                    let s = self.new_step(Some(parent), ev);
                    begun = Some(s);
                    s
                }
                Some((_, parent)) => parent,
                None => 0,
            }
        };
        let unseen = self.unseen.remove(&pid).unwrap_or_default();
        self.steps[step].events.extend(unseen);
        self.procs.insert(
            pid,
            Proc {
                step,
                ppid,
                execd: true,
                driver: driver_now,
                pending: Vec::new(),
            },
        );
        (step, begun)
    }

    fn exited(&mut self, pid: i32, ts_ns: i64) {
        self.tails.remove(&pid);
        if let Some(mut p) = self.procs.remove(&pid).filter(|_| !self.steps.is_empty()) {
            let step = &mut self.steps[p.step];
            step.events.append(&mut p.pending);
            if step.pid == pid && p.execd {
                step.ended_ns = Some(ts_ns);
            }
        }
    }

    /// Any other event (at `i`): its process's step's, or kept until its process is placed.
    fn other(&mut self, i: usize, ev: &Event) {
        let pid = ev.pid();
        if matches!(ev, Event::Open { .. }) {
            let tail = self.tails.entry(pid).or_default();
            if tail.len() == TAIL {
                tail.remove(0);
            }
            tail.push(i);
        } else {
            self.tails.remove(&pid);
        }
        match self.procs.get_mut(&pid) {
            Some(p) if !p.execd => p.pending.push(i),
            Some(p) if !self.steps.is_empty() => self.steps[p.step].events.push(i),
            Some(p) => p.pending.push(i),
            None => self.unseen.entry(pid).or_default().push(i),
        }
    }

    fn finish(mut self) -> Vec<Building> {
        if self.steps.is_empty() {
            return self.steps;
        }
        // Still running at the end (orphans the tracer stopped following), or never placed.
        for (_, mut p) in self.procs {
            self.steps[p.step].events.append(&mut p.pending);
        }
        for (_, evs) in self.unseen {
            self.steps[0].events.extend(evs);
        }
        self.steps
    }
}

/// Whether a program that would begin a step must stay in its parent's: one connected to
/// another of the job's programs by a pipe on its stdin, stdout or stderr (`cat a | wc -l > n`,
/// `subprocess.run(..., capture_output=True)`: its data reaches the other end, which no file
/// event shows), or one of Python multiprocessing's own processes (spawn and forkserver start
/// methods exec a fresh interpreter that talks to its parent over a pipe). The job's own pipes to
/// the world (`roar run -- make | tee log`) connect nothing inside it.
fn bound(argv: &[std::ffi::OsString], pipes: &crate::event::Stdio, outside: &[(u64, u64)]) -> bool {
    let internal = pipes.iter().flatten().any(|id| !outside.contains(id));
    let multiprocessing = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a.contains("multiprocessing.spawn")
            || a.contains("multiprocessing.forkserver")
            || a.contains("multiprocessing.resource_tracker")
    });
    internal || multiprocessing
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
