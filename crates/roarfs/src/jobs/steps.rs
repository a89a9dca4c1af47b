//! Steps of the mount's jobs. The mount cuts a job into steps by the rule every `roar run`
//! backend uses (`roar_tracer::steps`, SEMANTICS.md "Steps inside a job"): it writes what it
//! sees as that rule's events — each process the first time it makes a request (a fork, and an
//! exec when it runs another program than its parent), each exec the kernel reports of a
//! process of a job (the proc connector), each open, rename, link, unlink and truncate with the
//! process that made it — and hands them to the rule when the job ends.
//!
//! The mount sees a program only when it makes a request or when its exec is read, which is
//! after the fact: what it cannot see it leaves coarser, never in another step. A command that
//! used only descriptors its shell opened and was gone before it was read stays in the shell's
//! step; a stream it closed before it was read (coreutils close stdin before writing their
//! output at exit) is not among its streams, so a file a shell opened as its stdin (dash's
//! `tr < a > b`) stays the shell's input. bash opens redirections in the child, whose own
//! request places them. An exec whose event came too late or not at all (no CAP_NET_ADMIN) is
//! caught where the process writes: its first write through a handle reads its program again
//! when its exe changed.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

use roar_engine::journal::{Journaled, Record};
use roar_store::{now_ns, FileStat, StepRecord};
use roar_tracer::from_proc::Stream;
use roar_tracer::Event;

use super::attribute::read_proc_stat;
use super::{JobKey, Jobs};

/// Events kept per job at most (about 150 bytes each): a job past this is recorded as one step.
const MAX_EVENTS: usize = 1 << 20;

/// Deepest chain of processes between a job's root and a process read at once.
pub(super) const MAX_DEPTH: usize = 64;

/// One job's processes and accesses, as events. What the mount learns of its processes (forks,
/// execs, exits) is written to the job's journal as it is pushed ([`Record::Step`]); its accesses
/// are in the journal already, as calls into the rule.
#[derive(Debug, Default)]
pub(super) struct Log {
    events: Vec<Event>,
    /// Processes already written, by pid: their start time and the program they run.
    procs: HashMap<i32, Known>,
    execs: usize,
    /// Past [`MAX_EVENTS`]: no steps for this job.
    full: bool,
}

#[derive(Debug)]
struct Known {
    start: u64,
    program: Program,
}

/// What a process runs: a forked child runs its parent's until it execs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Program {
    exe: PathBuf,
    argv: Vec<OsString>,
}

fn program(ev: &Event) -> Option<Program> {
    match ev {
        Event::Exec { exe, argv, .. } => Some(Program {
            exe: exe.clone(),
            argv: argv.clone(),
        }),
        _ => None,
    }
}

/// A process read from /proc, not yet written.
struct Seen {
    pid: i32,
    ppid: i32,
    start: u64,
    exec: Event,
}

/// Reads process `pid` of a job on the mount at `mount` (dev, path): its program, and its
/// descriptors told apart without a stat (a stat of a file on the mount is a request to this
/// daemon, which may have no thread free to serve it): a link under the mount is its file,
/// identified by the mount's inode number from fdinfo; `pipe:[N]` and `socket:[N]` are pipes.
fn read(pid: i32, mount: &(u64, PathBuf)) -> Option<Seen> {
    let stat = read_proc_stat(pid).ok().flatten()?;
    let id = |fd: &str| -> Result<Stream, std::io::Error> {
        let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))?;
        let t = target.as_os_str().as_encoded_bytes();
        let pipe = |prefix: &[u8]| {
            t.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix(b"]"))
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok())
        };
        if let Some(n) = pipe(b"pipe:[").or_else(|| pipe(b"socket:[")) {
            let dead = fd == "0" && t.starts_with(b"pipe:") && crate::sys::dead_stdin_pipe(pid);
            return Ok(if dead {
                Stream::Other
            } else {
                Stream::Pipe(u64::MAX, n)
            });
        }
        if mount.1.as_os_str().is_empty() || !target.starts_with(&mount.1) {
            return Ok(Stream::Other);
        }
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("ino:"))
            .and_then(|v| v.trim().parse().ok())
            .map_or(Stream::Other, |ino| Stream::File(mount.0, ino)))
    };
    let streams = ["0", "1", "2"].map(id);
    let exec = roar_tracer::from_proc::exec_with(pid, |fd| {
        streams[fd as usize]
            .as_ref()
            .copied()
            .unwrap_or(Stream::Other)
    });
    // Gone while it was read: its program reads empty, which is no program at all.
    program(&exec).filter(|p| !p.argv.is_empty())?;
    // The start time after the reads: the same process throughout.
    (read_proc_stat(pid).ok().flatten()?.start == stat.start).then_some(Seen {
        pid,
        ppid: stat.ppid,
        start: stat.start,
        exec,
    })
}

impl Log {
    /// A job whose root process is `key`, read from /proc now.
    pub(super) fn new(key: JobKey, mount: &(u64, PathBuf), journal: &mut Journaled) -> Log {
        let mut log = Log::default();
        let root = read(key.pid, mount).filter(|s| s.start == key.start);
        if let Some((program, root)) = root.and_then(|r| Some((program(&r.exec)?, r))) {
            log.procs.insert(
                key.pid,
                Known {
                    start: key.start,
                    program,
                },
            );
            log.step(root.exec, journal);
        }
        log
    }

    /// Pushes `ev`, a process's fork, exec or exit, written to the journal first.
    fn step(&mut self, ev: Event, journal: &mut Journaled) {
        if !self.full {
            journal.step(&ev);
        }
        self.push(ev);
    }

    pub(super) fn push(&mut self, ev: Event) {
        if self.full {
            return;
        }
        if self.events.len() == MAX_EVENTS {
            self.full = true;
            self.events = Vec::new();
            tracing::info!(
                "roarfs: a job made more than {MAX_EVENTS} accesses: it is recorded as one step"
            );
            return;
        }
        if matches!(ev, Event::Exec { .. }) {
            self.execs += 1;
        }
        self.events.push(ev);
    }

    /// Writes processes read from /proc, the top-most first: a fork under its parent, and an
    /// exec when it runs another program. A process written already is written again only as
    /// an exec, when its program changed since.
    fn add(&mut self, chain: Vec<Seen>, journal: &mut Journaled) {
        for seen in chain.into_iter().rev() {
            let Some(now) = program(&seen.exec) else {
                continue;
            };
            if let Some(known) = self.procs.get_mut(&seen.pid) {
                if known.start == seen.start {
                    if known.program != now {
                        known.program = now;
                        self.step(seen.exec, journal);
                    }
                    continue;
                }
            }
            let parents = self.procs.get(&seen.ppid).map(|k| k.program.clone());
            let fork = Event::Fork {
                pid: seen.pid,
                ppid: seen.ppid,
                ts_ns: now_ns(),
            };
            self.step(fork, journal);
            let exec = parents.as_ref() != Some(&now);
            self.procs.insert(
                seen.pid,
                Known {
                    start: seen.start,
                    program: now,
                },
            );
            if exec {
                self.step(seen.exec, journal);
            }
        }
    }

    pub(super) fn exited(&mut self, pid: i32, journal: &mut Journaled) {
        if self.procs.remove(&pid).is_some() {
            let exit = Event::Exit {
                pid,
                ts_ns: now_ns(),
            };
            self.step(exit, journal);
        }
    }

    /// The job's steps (none when it is one step, or when its log was dropped).
    pub(super) fn steps(
        &self,
        ignore: &roar_store::ignore::Ignore,
        started_ns: i64,
        rule: &roar_tracer::steps::Rule,
    ) -> Vec<StepRecord> {
        if self.full || self.execs < 2 {
            return Vec::new();
        }
        // Start times are clock ticks: a file the job made in its first tick has a ctime at or
        // after the floor, as it must.
        let classified = roar_tracer::collect::classify(&self.events, started_ns, ignore);
        roar_tracer::steps::steps(&self.events, &classified, started_ns, rule)
    }
}

/// How long a placement waits for another to finish (see [`Jobs::place`]).
#[derive(Clone, Copy)]
enum Wait {
    Always,
    /// About 50 ms.
    Bounded,
}

/// An access as the rule's event, for [`Jobs::event`].
pub(crate) enum Access<'a> {
    /// An open of a regular file; `created`: the mount made it for this open.
    Open {
        path: &'a std::path::Path,
        flags: i32,
        created: bool,
        ino: u64,
        stat: &'a libc::stat,
    },
    Rename {
        from: &'a std::path::Path,
        to: &'a std::path::Path,
        exchange: bool,
    },
    Link {
        from: &'a std::path::Path,
        to: &'a std::path::Path,
    },
    Unlink(&'a std::path::Path),
    Truncate(&'a std::path::Path),
    Symlink(&'a std::path::Path),
}

/// A request's reply not sent yet. [`Jobs::event`] takes one, so an access is recorded before
/// the reply that lets its caller go on: once it has its reply, the caller (or a process it then
/// signals) can act on the same file, and that access must not reach the job's record first. A
/// handler that replied no longer holds its reply (fuser's replies are consumed by sending).
pub(crate) trait Unreplied {}

impl Jobs {
    /// Writes an access by the calling thread `tid` of `job` to the job's log, after the
    /// caller's process if the log does not know it yet, before the request's reply is sent.
    pub(crate) fn event(
        &self,
        _unreplied: &impl Unreplied,
        tid: u32,
        job: JobKey,
        access: Access<'_>,
    ) {
        if let Some(delay) = record_delay() {
            std::thread::sleep(delay);
        }
        let Some(pid) = self.member(tid as i32, job, false) else {
            return;
        };
        let ts_ns = now_ns();
        let ev = match access {
            Access::Open {
                path,
                flags,
                created,
                ino,
                stat,
            } => Event::Open {
                pid,
                path: path.to_owned(),
                // The mount made it: no prior content, whatever its ctime says.
                flags: if created {
                    flags | libc::O_CREAT | libc::O_EXCL
                } else {
                    // Not made by this open, whatever the caller asked (the kernel sends no
                    // O_CREAT with FUSE_OPEN; said here so that the rule never asks the ctime).
                    flags & !(libc::O_CREAT | libc::O_EXCL)
                },
                // A file is known to the processes by the mount's inode numbers: what their
                // standard streams show.
                stat: Some(FileStat {
                    dev: self.mount_dev(),
                    ino,
                    ..crate::sys::file_stat(stat)
                }),
                ts_ns,
            },
            Access::Rename { from, to, exchange } if exchange => Event::Exchange {
                pid,
                a: from.to_owned(),
                b: to.to_owned(),
                ts_ns,
            },
            Access::Rename { from, to, .. } => Event::Rename {
                pid,
                from: from.to_owned(),
                to: to.to_owned(),
                ts_ns,
            },
            Access::Link { from, to } => Event::Link {
                pid,
                from: from.to_owned(),
                to: to.to_owned(),
                ts_ns,
            },
            Access::Unlink(path) => Event::Unlink {
                pid,
                path: path.to_owned(),
                ts_ns,
            },
            Access::Truncate(path) => Event::Truncate {
                pid,
                path: path.to_owned(),
                ts_ns,
            },
            Access::Symlink(path) => Event::Symlink {
                pid,
                path: path.to_owned(),
                ts_ns,
            },
        };
        if let Some(j) = self.inner.lock().expect("jobs lock").jobs.get_mut(&job) {
            let access = Record::Event(ev);
            self.call(job, j, &access);
            if let Record::Event(ev) = access {
                j.log.push(ev);
            }
        }
    }

    /// A process's first write through a handle: its program is read again when its exe is
    /// not the one the log knows. It may have exec'd since the log saw it with nothing to say
    /// so: no process events, or its exec was over before the event was read (`tr` writing the
    /// `> out` its shell opened, at exit).
    pub(crate) fn writing(&self, tid: u32, job: JobKey) {
        let (pid, exe) = {
            let inner = self.inner.lock().expect("jobs lock");
            let pid = inner
                .by_tid
                .get(&(tid as i32))
                .map_or(tid as i32, |c| c.pid);
            let exe = inner
                .jobs
                .get(&job)
                .and_then(|j| j.log.procs.get(&pid))
                .map(|k| k.program.exe.clone());
            (pid, exe)
        };
        let now = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        if exe.is_none() || exe != now {
            self.member(tid as i32, job, true);
        }
    }

    /// The kernel says `pid` exec'd: if it or its parent is a process of a live job, the
    /// job's log gets the exec (read now, while the program most likely still runs).
    pub(super) fn exec_seen(&self, pid: i32) {
        let job = {
            let inner = self.inner.lock().expect("jobs lock");
            if inner.jobs.is_empty() {
                return;
            }
            inner.by_tid.get(&pid).and_then(|c| c.job)
        };
        let job = match job {
            Some(job) => job,
            None => {
                let Some(stat) = read_proc_stat(pid).ok().flatten() else {
                    return;
                };
                // Its parent made a request, or is in a job's log (a `sh -c` between make and
                // the recipe's program that never touched the mount).
                let inner = self.inner.lock().expect("jobs lock");
                let parent = inner
                    .by_tid
                    .get(&stat.ppid)
                    .and_then(|c| c.job)
                    .or_else(|| {
                        inner
                            .jobs
                            .iter()
                            .find(|(k, j)| {
                                k.pid == stat.ppid || j.log.procs.contains_key(&stat.ppid)
                            })
                            .map(|(k, _)| *k)
                    });
                match parent {
                    Some(job) => job,
                    None => return,
                }
            }
        };
        self.place(pid, job, true, Wait::Always);
    }

    /// The pid of thread `tid` of `job`, with its process (and any process between it and
    /// the job's root) written to the job's log: read from /proc when the log does not know it,
    /// or when `recheck`.
    fn member(&self, tid: i32, job: JobKey, recheck: bool) -> Option<i32> {
        let (pid, known) = {
            let inner = self.inner.lock().expect("jobs lock");
            let pid = inner.by_tid.get(&tid).map_or(tid, |c| c.pid);
            (pid, knows(&inner, job, pid, true)?)
        };
        // The usual request: a process the log knows, and no placement to wait for.
        if !known || recheck {
            self.place(pid, job, recheck, Wait::Bounded);
        }
        Some(pid)
    }

    /// Writes `pid` to `job`'s log, with its ancestors up to one the log knows (or the job's
    /// root), when the log does not know it or `recheck`. One placement at a time: the
    /// programs the log sees for a process are in the order it ran them (an exec read late by
    /// one thread cannot come before the program another thread read earlier). /proc is read
    /// outside the jobs lock: a process in the middle of an exec cannot be read until its exec
    /// is over, and requests must not wait for that.
    ///
    /// A request's thread waits for another placement only so long (`Wait::Bounded`): the
    /// other may be reading a process whose exec waits for a request of its own (opening a
    /// program on the mount), which needs a free request thread. Unplaced, its events still
    /// go to the log and the rule places them by their pid, coarser at worst.
    fn place(&self, pid: i32, job: JobKey, recheck: bool, wait: Wait) {
        let _one = match wait {
            Wait::Always => self.placing.lock().expect("placing lock"),
            Wait::Bounded => {
                let mut tries = 0;
                loop {
                    match self.placing.try_lock() {
                        Ok(guard) => break guard,
                        Err(std::sync::TryLockError::Poisoned(e)) => panic!("placing lock: {e}"),
                        // A placement takes tens of microseconds: yield first, then sleep.
                        Err(std::sync::TryLockError::WouldBlock) if tries < 100 => {
                            tries += 1;
                            std::thread::yield_now();
                        }
                        Err(std::sync::TryLockError::WouldBlock) if tries < 150 => {
                            tries += 1;
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        Err(std::sync::TryLockError::WouldBlock) => return,
                    }
                }
            }
        };
        let knows =
            |p: i32, exact: bool| knows(&self.inner.lock().expect("jobs lock"), job, p, exact);
        match knows(pid, true) {
            None => return,
            Some(true) if !recheck => return,
            Some(_) => {}
        }
        let mount = self.mount();
        let mut chain: Vec<Seen> = Vec::new();
        let mut next = pid;
        while chain.len() < MAX_DEPTH {
            let Some(seen) = read(next, mount) else { break };
            let up = seen.ppid;
            chain.push(seen);
            if up == job.pid || up <= 1 || knows(up, false) != Some(false) {
                break;
            }
            next = up;
        }
        if let Some(j) = self.inner.lock().expect("jobs lock").jobs.get_mut(&job) {
            j.log.add(chain, &mut j.rules);
        }
    }
}

/// Fault injection (`ROAR_MOUNT_RECORD_DELAY_MS=N`): each access is recorded up to N ms late,
/// by a different amount each time, as a busy machine would (a thread descheduled, a lock held).
/// No delay may change a record, since a handler records before it replies ([`Unreplied`]); the
/// generated programs run on a mount with delays to find any way round that.
fn record_delay() -> Option<std::time::Duration> {
    static MAX_US: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let max_us = (*MAX_US.get_or_init(|| {
        let ms: u64 = std::env::var("ROAR_MOUNT_RECORD_DELAY_MS")
            .ok()?
            .parse()
            .ok()?;
        Some(ms * 1000)
    }))?;
    // splitmix64 of a sequence number: spread, and the same sequence of delays each run.
    let mut z = SEQ
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    Some(std::time::Duration::from_micros(z % (max_us + 1)))
}

/// Whether `job`'s log knows process `pid` (None: no such live job). `exact`: and it is still
/// that process, while its main thread's cached start agrees (an exit removes it from the log
/// when process events are followed).
fn knows(inner: &super::Inner, job: JobKey, pid: i32, exact: bool) -> Option<bool> {
    let j = inner.jobs.get(&job)?;
    Some(
        j.log
            .procs
            .get(&pid)
            .is_some_and(|k| !exact || inner.by_tid.get(&pid).is_none_or(|c| c.start == k.start)),
    )
}

impl super::Inner {
    /// The process `pid` of `job` exited.
    pub(super) fn exited(&mut self, job: JobKey, pid: i32) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.log.exited(pid, &mut j.rules);
        }
    }
}
