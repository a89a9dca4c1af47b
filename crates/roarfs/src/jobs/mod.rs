//! Attribution: which job an access through the mount belongs to, and each live job's files.
//!
//! A process belongs to an implicit job rooted at its top-most ancestor in the same process group
//! that is not an interactive shell, terminal multiplexer, sshd, login or init. Interactive shells
//! give every command line its own process group, so `python train.py` with its dataloader workers
//! is one job with argv `python train.py`; a script run as `bash pipeline.sh` is one job. A job is
//! identified by its root's pid and start time, with argv/cwd/exe read once from /proc, and ends
//! when the root exits. Processes under `roar run` are left to that run's tracer, which records
//! them in its own job.

mod births;
mod steps;

pub(crate) use steps::{Access, Unreplied};

use roar_store::ignore::Ignore;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use roar_engine::classify::Context;
use roar_engine::journal::{Journaled, Record};
use roar_engine::{Event, Fact, Judge, Version};
use roar_store::{now_ns, ContentHash, JobRecord, Ops, Outcome, ProcessRecord, Writer};

/// A job's identity: its root process and that process's start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub pid: i32,
    pub start: u64,
}

#[derive(Debug, Clone)]
struct ProcInfo {
    pid: i32,
    ppid: i32,
    pgid: i32,
    start: u64,
    comm: String,
}

/// A process's stat line; `Ok(None)` when there is no such process (any more). Any other
/// failure to read it (descriptors or memory exhausted) is an error the caller must not take
/// for "not a process of any job".
fn read_proc_stat(pid: i32) -> io::Result<Option<ProcInfo>> {
    let s = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(parse_stat(pid, &s))
}

/// A stat line read above, parsed by procfs (read here: an unreadable /proc is an error the
/// caller must see, and procfs's own open would fold it into its errors).
fn parse_stat(pid: i32, s: &str) -> Option<ProcInfo> {
    use procfs::FromRead;
    let stat = procfs::process::Stat::from_read(s.as_bytes()).ok()?;
    Some(ProcInfo {
        pid,
        ppid: stat.ppid,
        pgid: stat.pgrp,
        start: stat.starttime,
        comm: stat.comm,
    })
}

/// The thread group (process) a thread id belongs to: FUSE reports the calling thread's id.
fn tgid(tid: i32) -> io::Result<i32> {
    let status = match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(s) => s,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => return Ok(tid),
        Err(e) => return Err(e),
    };
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(tid))
}

/// The process's argv exactly, empty arguments included (`prog "" x` is not `prog x`).
fn cmdline(pid: i32) -> Vec<OsString> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    roar_store::argv_from_blob(raw.strip_suffix(b"\0").unwrap_or(&raw))
}

const SHELLS: &[&str] = &["bash", "sh", "dash", "zsh", "fish", "ksh", "tcsh", "csh"];
const BOUNDARIES: &[&str] = &[
    "init",
    "systemd",
    "sshd",
    "tmux",
    "tmux: server",
    "screen",
    "SCREEN",
    "login",
    "su",
    "sudo",
    "containerd-shim",
    "runc",
];

/// An interactive shell: a shell with no script or `-c` command (`bash`, `-bash`, `bash -i`).
fn is_interactive_shell(info: &ProcInfo) -> bool {
    let name = info.comm.trim_start_matches('-');
    if !SHELLS.contains(&name) {
        return false;
    }
    let argv = cmdline(info.pid);
    argv.iter()
        .skip(1)
        .all(|a| a.to_string_lossy().starts_with('-') && a != "-c")
}

/// Whether `a` and `b` run the same program with the same arguments (`b` forked from `a`, or a
/// copy of it, without exec), or None when /proc cannot tell (a process exiting shows no exe).
fn same_program_seen(a: i32, b: i32) -> Option<bool> {
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let (ea, eb) = (exe(a)?, exe(b)?);
    Some(ea == eb && cmdline_bytes(a).is_some_and(|c| Some(c) == cmdline_bytes(b)))
}

fn cmdline_bytes(pid: i32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/cmdline")).ok()
}

fn is_boundary(info: &ProcInfo) -> bool {
    info.pid <= 1 || BOUNDARIES.contains(&info.comm.as_str()) || is_interactive_shell(info)
}

/// `roar run` traces its own children; the mount leaves them to it.
fn is_roar_run(info: &ProcInfo) -> bool {
    if info.comm != "roar" {
        return false;
    }
    let argv = cmdline(info.pid);
    argv.get(1).is_some_and(|a| a == "run")
}

struct LiveJob {
    argv: Vec<OsString>,
    cwd: PathBuf,
    exe: Option<PathBuf>,
    started_ns: i64,
    /// The job's uid: its row's, and its journal's name.
    uid: String,
    /// The engine's rule, applied to each access as it happens (the job's files and what is
    /// known of their content), each call written to the job's journal first.
    rules: Journaled,
    /// Writable handles still open: the job is finalised only once they are released.
    open_writers: usize,
    root_gone: bool,
    /// The job's row, written (running) when it first touched a recorded path: ids follow the
    /// order jobs started, and `roar log` shows the job while it runs.
    begun: Option<roar_store::Begun>,
    /// Its processes' programs and accesses, for cutting it into steps.
    log: steps::Log,
}

/// The live jobs of one mount and the writer their records go to.
pub struct Jobs {
    /// Paths that are never inputs or outputs (`roar run`'s rule and the project's globs).
    ignore: Ignore,
    inner: Mutex<Inner>,
    /// Thread exits arrive from the kernel (see [`Jobs::watch_exits`]): a cached thread is
    /// alive, and its job is known without reading /proc.
    exits_watched: std::sync::atomic::AtomicBool,
    writer: Writer,
    boot_ns: i64,
    tick_ns: i64,
    host: Option<String>,
    /// The machine, recorded with every job.
    machine: Option<roar_store::Runtime>,
    /// Which programs begin steps (`[steps] drivers`).
    rule: roar_tracer::steps::Rule,
    /// The mount's device and path, once mounted: with the mount's inode numbers, a file's
    /// identity as its processes see it.
    mount: std::sync::OnceLock<(u64, PathBuf)>,
    /// Held while processes are read into a job's log (see `steps`).
    placing: Mutex<()>,
    /// Where each live job's journal goes, and what of a command line it may keep.
    journals: crate::Journals,
    /// Journals made ahead in that directory: a job begins with no file made under `inner`.
    ahead: Mutex<Option<roar_engine::journal::Ahead>>,
    /// Where the mount is, for its journals.
    mounted_on: PathBuf,
}

/// What the mount knows of a thread that made a request.
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// When the thread started (a reused id is another thread).
    start: u64,
    /// Its job, or None when it is not recorded here.
    job: Option<JobKey>,
    /// Its process (thread group).
    pid: i32,
}

#[derive(Default)]
struct Inner {
    by_tid: HashMap<i32, Cached>,
    jobs: HashMap<JobKey, LiveJob>,
    births: births::Births,
}

fn boot_ns() -> i64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let btime: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    btime * 1_000_000_000
}

/// The longest an orphan's first request waits for the kernel's word on its fork
/// (`Jobs::birth_of`).
const BIRTH_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

impl Jobs {
    pub fn new(writer: Writer, ignore: Ignore) -> Jobs {
        let hz = crate::sys::clock_ticks_per_second();
        Jobs {
            ignore,
            inner: Mutex::new(Inner::default()),
            exits_watched: std::sync::atomic::AtomicBool::new(false),
            writer,
            boot_ns: boot_ns(),
            tick_ns: 1_000_000_000 / hz,
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned()),
            machine: None,
            rule: roar_tracer::steps::Rule::default(),
            mount: std::sync::OnceLock::new(),
            placing: Mutex::new(()),
            journals: None,
            ahead: Mutex::new(None),
            mounted_on: PathBuf::new(),
        }
    }

    /// Keeps each live job's calls into the rule in a journal (docs/SEMANTICS.md, "Crashes"),
    /// in the directory `journals` names, redacted by its policy: a daemon killed at any moment
    /// loses none of it. `dir`: where the mount is.
    pub fn with_journals(mut self, journals: crate::Journals, dir: &Path) -> Jobs {
        self.ahead = Mutex::new(journals.as_ref().map(|(d, _)| {
            roar_engine::journal::Ahead::new(d, roar_engine::journal::Writer::Mount)
        }));
        self.journals = journals;
        self.mounted_on = dir.to_owned();
        self
    }

    /// A job first seen now, with its journal begun: its header and where the mount is.
    fn live_job(&self, key: JobKey) -> LiveJob {
        let ahead = self.ahead.lock().expect("journals made ahead");
        let (uid, journal, policy) = match (ahead.as_ref(), &self.journals) {
            (Some(ahead), Some((_, policy))) => match ahead.take() {
                Ok((uid, j)) => (uid, Some(j), policy.clone()),
                Err(e) => {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| tracing::warn!("roarfs: no journal for a job ({e}): a daemon killed now loses its events"));
                    (roar_engine::journal::new_uid(), None, policy.clone())
                }
            },
            _ => (roar_engine::journal::new_uid(), None, Default::default()),
        };
        drop(ahead);
        let mut job = LiveJob {
            argv: cmdline(key.pid),
            cwd: std::fs::read_link(format!("/proc/{}/cwd", key.pid)).unwrap_or_default(),
            exe: std::fs::read_link(format!("/proc/{}/exe", key.pid)).ok(),
            started_ns: self.boot_ns + key.start as i64 * self.tick_ns,
            uid,
            rules: Journaled::new(journal, policy),
            open_writers: 0,
            root_gone: false,
            begun: None,
            log: steps::Log::default(),
        };
        let header = self.header(key, &job);
        job.rules.write(&Record::Job(Box::new(header)));
        job.rules.write(&Record::Mounted(self.mounted_on.clone()));
        job.log = steps::Log::new(key, self.mount(), &mut job.rules);
        job
    }

    /// The job of the calling thread `tid`, or None for processes the mount does not record
    /// (and for a caller outside the daemon's pid namespace, which FUSE reports as pid 0). An
    /// error when the caller's /proc entries cannot be read.
    pub fn job_of(&self, tid: u32) -> io::Result<Option<JobKey>> {
        let tid = tid as i32;
        if tid <= 0 {
            return Ok(None);
        }
        if self
            .exits_watched
            .load(std::sync::atomic::Ordering::Acquire)
        {
            if let Some(c) = self.inner.lock().expect("jobs lock").by_tid.get(&tid) {
                return Ok(c.job);
            }
        }
        let Some(me) = read_proc_stat(tid)? else {
            return Ok(None);
        };
        if let Some(c) = self.inner.lock().expect("jobs lock").by_tid.get(&tid) {
            if c.start == me.start {
                return Ok(c.job);
            }
        }
        let pid = tgid(tid)?;
        let job = self.attribute(pid)?;
        let mut inner = self.inner.lock().expect("jobs lock");
        if let Some(key) = job {
            inner.jobs.entry(key).or_insert_with(|| self.live_job(key));
        }
        if inner.by_tid.len() > 65_536 {
            inner.by_tid.clear();
        }
        inner.by_tid.insert(
            tid,
            Cached {
                start: me.start,
                job,
                pid,
            },
        );
        Ok(job)
    }

    /// The start-time clock's tick of a kernel event stamped `at_ns` (CLOCK_MONOTONIC), given
    /// how long the machine was `suspended` (CLOCK_BOOTTIME minus CLOCK_MONOTONIC).
    fn tick(&self, at_ns: u64, suspended: i64) -> i64 {
        (at_ns as i64 + suspended) / self.tick_ns
    }

    fn now_tick(&self) -> i64 {
        self.tick(
            crate::sys::monotonic_ns(),
            crate::sys::boottime_minus_monotonic_ns(),
        )
    }

    /// Follows the kernel's process events, dropping a thread id from the cache when its thread
    /// exits, so that a request from a cached thread needs no /proc read and a reused id is
    /// never taken for the old thread. An exit removes the entry only if the cached thread had
    /// started by then: read late (the reader lags behind a busy machine), an exit must not evict
    /// the new thread that reuses its id — nor, as fork events did, a forked worker cached before
    /// the event of its own fork was read, which made its job end while it still ran. Without
    /// the events (no CAP_NET_ADMIN), every request reads the caller's /proc/TID/stat to check
    /// its start time, as before.
    pub fn watch_exits(self: &std::sync::Arc<Self>) {
        let events = match crate::sys::ExitEvents::open() {
            Ok(e) => e,
            Err(e) => {
                tracing::info!(
                    "roarfs: no process events ({e}): attribution reads /proc per request"
                );
                return;
            }
        };
        let jobs = std::sync::Arc::downgrade(self);
        self.inner
            .lock()
            .expect("jobs lock")
            .births
            .listening(self.now_tick());
        self.exits_watched
            .store(true, std::sync::atomic::Ordering::Release);
        let spawned = std::thread::Builder::new()
            .name("roarfs-exits".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let seen = events.wait(&mut buf);
                    let Some(jobs) = jobs.upgrade() else { return };
                    // Start times are clock ticks of CLOCK_BOOTTIME; exits are stamped with
                    // CLOCK_MONOTONIC (they differ by the time the machine was suspended).
                    let suspended = crate::sys::boottime_minus_monotonic_ns();
                    let mut inner = jobs.inner.lock().expect("jobs lock");
                    match seen {
                        Ok(crate::sys::Exits::Seen {
                            forks,
                            exits,
                            execs,
                        }) => {
                            for f in forks {
                                let at = jobs.tick(f.at_ns, suspended);
                                inner.births.forked(f.parent, f.child, at);
                            }
                            for &(pid, at_ns) in &execs {
                                inner.births.execd(pid, jobs.tick(at_ns, suspended));
                            }
                            for e in exits {
                                let tick = jobs.tick(e.at_ns, suspended);
                                inner.births.read(tick);
                                let gone = inner
                                    .by_tid
                                    .get(&e.tid)
                                    .copied()
                                    .filter(|c| c.start as i64 <= tick);
                                if let Some(c) = gone {
                                    inner.by_tid.remove(&e.tid);
                                    if let Some(job) = c.job.filter(|_| c.pid == e.tid) {
                                        inner.exited(job, c.pid);
                                    }
                                }
                            }
                            drop(inner);
                            for (pid, _) in execs {
                                jobs.exec_seen(pid);
                            }
                        }
                        // Exit events were lost (the kernel reports every process of the
                        // machine: a busy one overflows the socket). What is lost is which
                        // cached threads ended, not which still run: keep those /proc shows
                        // alive with the same start time. Clearing the cache instead forgot a
                        // job's members, and a forked worker outliving its root then had its
                        // job recorded early and its later writes made a job of their own.
                        Ok(crate::sys::Exits::Lost) => {
                            inner.births.lost(jobs.now_tick());
                            inner.by_tid.retain(|tid, c| {
                                matches!(read_proc_stat(*tid), Ok(Some(p)) if p.start == c.start)
                            })
                        }
                        Err(e) => {
                            // Without events the cache cannot be trusted: back to /proc.
                            jobs.exits_watched
                                .store(false, std::sync::atomic::Ordering::Release);
                            inner.by_tid.clear();
                            tracing::error!("roarfs: process events stopped ({e}): attribution reads /proc per request");
                            return;
                        }
                    }
                }
            });
        if spawned.is_err() {
            self.exits_watched
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// Whether a thread of `key`'s job other than its root is still alive (a forked worker
    /// outliving the root keeps the job open, as `roar run` waits for every descendant).
    fn members_alive(by_tid: &HashMap<i32, Cached>, key: &JobKey) -> bool {
        by_tid.iter().any(|(tid, c)| {
            c.job == Some(*key)
                && *tid != key.pid
                && matches!(read_proc_stat(*tid), Ok(Some(p)) if p.start == c.start)
        })
    }

    fn attribute(&self, pid: i32) -> io::Result<Option<JobKey>> {
        let Some(mut cur) = read_proc_stat(pid)? else {
            return Ok(None);
        };
        if is_roar_run(&cur) {
            return Ok(None);
        }
        while let Some(parent) = read_proc_stat(cur.ppid)? {
            if is_roar_run(&parent) {
                return Ok(None);
            }
            // A new process group (setsid, a daemon's double fork) starts a new job only where a
            // program was exec'd: a fork that did not exec (multiprocessing, a daemonized copy)
            // stays in its parent's job, as forked workers stay in their parent's process.
            let regrouped = parent.pgid != cur.pgid && !self.is_copy(&parent, &cur);
            if regrouped || is_boundary(&parent) {
                // Its parent now may not be the one that forked it (a daemon's double fork).
                if let Some(forker) = self.forked_from(&cur, &parent)? {
                    return self.attribute(forker);
                }
                // Still look above for a `roar run` that owns this process group's session.
                let mut up = parent;
                while up.pid > 1 {
                    if is_roar_run(&up) {
                        return Ok(None);
                    }
                    match read_proc_stat(up.ppid)? {
                        Some(p) => up = p,
                        None => break,
                    }
                }
                break;
            }
            cur = parent;
        }
        Ok(Some(JobKey {
            pid: cur.pid,
            start: cur.start,
        }))
    }

    /// Whether `cur` is a fork of `parent` that did not exec: by /proc (the same program with the
    /// same arguments), else — a parent that is exiting shows no exe — by the kernel's events. Not
    /// the events first: an exec their reader has not read yet would make a program exec'd from a
    /// job's process look like a copy of it (and its own job part of the job above).
    fn is_copy(&self, parent: &ProcInfo, cur: &ProcInfo) -> bool {
        if let Some(same) = same_program_seen(parent.pid, cur.pid) {
            return same;
        }
        match self.birth_of(cur, true) {
            Some(b) if b.parent == parent.pid => !b.execd,
            _ => false,
        }
    }

    /// The live process whose fork made `cur`, when `cur`'s parent now (`parent`) is not the one
    /// that forked it: the forks between them were made by processes gone since, and neither
    /// they nor `cur` exec'd a program (a daemonized copy of a job's process, which stays in the
    /// job). None when `parent` forked it, when a program was exec'd on the way, or when what
    /// forked it is not known (no process events, or events lost).
    fn forked_from(&self, cur: &ProcInfo, parent: &ProcInfo) -> io::Result<Option<i32>> {
        // Waiting for the reader only where an orphan may land (init, systemd, or a subreaper:
        // any parent that is not a shell, terminal or login): a command started from a shell,
        // the common first request of a job, never waits.
        let adopted = parent.pid == 1
            || ["init", "systemd"].contains(&parent.comm.as_str())
            || !is_boundary(parent);
        let Some(birth) = self.birth_of(cur, adopted) else {
            return Ok(None);
        };
        if birth.parent == parent.pid || birth.execd {
            return Ok(None);
        }
        let mut p = birth.parent;
        for _ in 0..steps::MAX_DEPTH {
            if let Some(alive) = read_proc_stat(p)? {
                // Still a copy of it (an exec not read yet would show here). An exited process
                // not yet reaped (the daemon's middle fork, until its parent waits for it)
                // shows no program: the events say what it was, as for one gone.
                let seen = (alive.start <= cur.start)
                    .then(|| same_program_seen(p, cur.pid))
                    .flatten();
                if let Some(same) = seen {
                    return Ok(same.then_some(p));
                }
            }
            let inner = self.inner.lock().expect("jobs lock");
            match inner.births.of_gone(p, cur.start as i64) {
                Some(b) if !b.execd => p = b.parent,
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// `cur`'s fork as the kernel reported it; with `wait`, waiting for the reader of its
    /// events when it has not read that far yet — until it has (microseconds on an idle
    /// machine), or at most `BIRTH_WAIT`: on a loaded machine the reader thread can be scheduled
    /// tens of milliseconds late (20 ms was too short: the generator's daemons under a loaded
    /// CI became jobs of their own), and only an orphan's first request ever waits.
    fn birth_of(&self, cur: &ProcInfo, wait: bool) -> Option<births::Birth> {
        let deadline = std::time::Instant::now() + BIRTH_WAIT;
        while self
            .exits_watched
            .load(std::sync::atomic::Ordering::Acquire)
        {
            let known =
                (self.inner.lock().expect("jobs lock").births).of(cur.pid, cur.start as i64);
            match known {
                births::Known::Born(b) => return Some(b),
                births::Known::NotYet if wait && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_micros(50))
                }
                _ => return None,
            }
        }
        None
    }

    /// Calls `job`'s rule with `record` (written to its journal first); the job's row is begun
    /// at its first recorded path (ids follow the order jobs started, and `roar log` shows the
    /// job while it runs).
    fn call(&self, key: JobKey, j: &mut LiveJob, record: &Record) {
        let judge = Judge::Globs(&self.ignore);
        j.rules.call(&context(&judge, j.started_ns), record);
        self.begin(key, j);
    }

    fn begin(&self, key: JobKey, j: &mut LiveJob) {
        if j.begun.is_none() && !j.rules.rules().is_empty() {
            let header = self.header(key, j);
            j.begun = self.writer.begin_job(&header).ok();
        }
    }

    /// Asks `job`'s rule, with its context.
    fn with_rules<T>(
        &self,
        job: JobKey,
        f: impl FnOnce(&roar_engine::Rules, &Context) -> T,
    ) -> Option<T> {
        let inner = self.inner.lock().expect("jobs lock");
        let j = inner.jobs.get(&job)?;
        let judge = Judge::Globs(&self.ignore);
        Some(f(j.rules.rules(), &context(&judge, j.started_ns)))
    }

    /// Calls `job`'s rule with `record`, if the job is live.
    fn call_live(&self, job: JobKey, record: &Record) {
        let mut inner = self.inner.lock().expect("jobs lock");
        if let Some(j) = inner.jobs.get_mut(&job) {
            self.call(job, j, record);
        }
    }

    /// Where `job`'s events are now: taken before a hash, it tells [`Jobs::found`] and
    /// [`Jobs::found_in`] which changes the hash may have missed (0 for a job not live).
    pub fn mark(&self, job: JobKey) -> u64 {
        self.with_rules(job, |r, _| r.mark()).unwrap_or(0)
    }

    /// `job` saw `content` at `path`, which is the mount's inode `ino` now, having taken `mark`
    /// before reading it: told before an access that changes the path, it is what the access
    /// found there; after, what it left.
    pub fn found(&self, job: JobKey, path: &Path, ino: u64, content: ContentHash, mark: u64) {
        let fact = Fact {
            file: (self.mount_dev(), ino),
            content,
            mark,
        };
        let found = Record::Found {
            path: path.to_owned(),
            fact,
            ts: now_ns(),
        };
        self.call_live(job, &found);
    }

    /// The last writer of the mount's inode `ino` left `content` (read after `mark`): the content
    /// of every name the job knows that file by (never one another file was renamed onto since,
    /// nor one changed since the mark).
    pub fn found_in(&self, job: JobKey, ino: u64, content: ContentHash, mark: u64) {
        let fact = Fact {
            file: (self.mount_dev(), ino),
            content,
            mark,
        };
        self.call_live(job, &Record::FoundIn(fact));
    }

    /// Whether `job` read prior content at `path` whose hash is not known yet.
    pub fn wants_input(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, _| r.wants_input(path))
            .unwrap_or(false)
    }

    /// Whether what is at `path` may be content `job` has not made nor read yet: an in-place
    /// write would keep it as an input.
    pub fn may_keep_prior(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, _| {
            r.state(path)
                .is_none_or(|st| !st.job_made && !st.reads_prior)
        })
        .unwrap_or(false)
    }

    /// Whether `path` may still name the mount's inode `ino` as far as `job` knows (a change
    /// through a handle on it happened there only then).
    pub fn names(&self, job: JobKey, path: &Path, ino: u64) -> bool {
        let file = (self.mount_dev(), ino);
        self.with_rules(job, |r, _| r.names(path, file))
            .unwrap_or(true)
    }

    /// Whether the content now at `path` is unknown to `job`'s rule.
    pub fn wants_content(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, cx| r.wants_content(cx, path))
            .unwrap_or(false)
    }

    /// Whether the job unlinked a file at `path` (at any time: sqlite deletes its journal and
    /// makes a new one at the same name, each transaction).
    pub fn unlinked(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, _| {
            r.state(path).is_some_and(|st| st.ops.contains(Ops::UNLINK))
        })
        .unwrap_or(false)
    }

    /// A read of `path` whose content is known without hashing (an archive member), as `job`'s.
    pub fn read_known(&self, job: JobKey, path: &Path, content: ContentHash) {
        let open = Event::Open {
            pid: job.pid,
            path: path.to_owned(),
            flags: libc::O_RDONLY,
            stat: None,
            ts_ns: now_ns(),
        };
        let mut inner = self.inner.lock().expect("jobs lock");
        let Some(j) = inner.jobs.get_mut(&job) else {
            return;
        };
        let open = Record::Event(open);
        self.call(job, j, &open);
        if let Record::Event(ev) = open {
            j.log.push(ev);
        }
        if j.rules.rules().wants_input(path) {
            let found = Record::FoundNamed {
                path: path.to_owned(),
                content,
                mark: j.rules.rules().mark(),
                ts: now_ns(),
            };
            self.call(job, j, &found);
        }
    }

    /// A directory moved: every live job's files below it now live below its new name, and
    /// each name a job knew below the new name holds what the moved directory held there:
    /// `holds` says whether that is a file, by the name's place below `to`.
    pub fn moved_dir(&self, from: &Path, to: &Path, holds: impl Fn(&Path) -> bool) {
        let mut inner = self.inner.lock().expect("jobs lock");
        let moved = Record::MovedDir {
            from: from.to_owned(),
            to: to.to_owned(),
        };
        let judge = Judge::Globs(&self.ignore);
        for job in inner.jobs.values_mut() {
            let cx = context(&judge, job.started_ns);
            job.rules.call(&cx, &moved);
            for path in job.rules.rules().refilled_below(to) {
                let rest = path.strip_prefix(to).expect("below the new name");
                let holds = holds(rest);
                job.rules.call(&cx, &Record::Holds { path, holds });
            }
        }
    }

    pub fn writer_opened(&self, job: JobKey) {
        if let Some(j) = self.inner.lock().expect("jobs lock").jobs.get_mut(&job) {
            j.open_writers += 1;
        }
    }

    /// Writable handles still open, over every live job.
    pub fn writers_open(&self) -> usize {
        let inner = self.inner.lock().expect("jobs lock");
        inner.jobs.values().map(|j| j.open_writers).sum()
    }

    pub fn writer_released(&self, job: JobKey) {
        if let Some(j) = self.inner.lock().expect("jobs lock").jobs.get_mut(&job) {
            j.open_writers = j.open_writers.saturating_sub(1);
        }
    }

    /// Records every job whose root process has exited (and whose writers are all released);
    /// with `all`, every job: only after the unmount (see [`Jobs::record`]). Returns the store ids of the jobs recorded.
    /// No more jobs begin: the journals made ahead and not taken are removed.
    pub fn stop_journals_ahead(&self) {
        drop(self.ahead.lock().expect("journals made ahead").take());
    }

    pub fn finish(&self, all: bool) -> Vec<i64> {
        let done: Vec<(JobKey, LiveJob)> = {
            let mut inner = self.inner.lock().expect("jobs lock");
            let mut keys = Vec::new();
            let Inner { jobs, by_tid, .. } = &mut *inner;
            for (key, job) in jobs.iter_mut() {
                if !job.root_gone {
                    // An unreadable /proc (descriptors exhausted) is not an exit.
                    job.root_gone = match read_proc_stat(key.pid) {
                        Ok(Some(p)) => p.start != key.start,
                        Ok(None) => true,
                        Err(_) => false,
                    };
                    if job.root_gone {
                        job.rules.write(&Record::RootGone);
                    }
                }
                // A job whose root is gone stays open while a member still runs.
                if all
                    || (job.root_gone && job.open_writers == 0 && !Self::members_alive(by_tid, key))
                {
                    keys.push(*key);
                }
            }
            if !keys.is_empty() {
                inner
                    .by_tid
                    .retain(|_, c| c.job.is_none_or(|j| !keys.contains(&j)));
            }
            keys.into_iter()
                .filter_map(|k| inner.jobs.remove(&k).map(|j| (k, j)))
                .collect()
        };
        // Jobs that end in the same tick are recorded in the order they started.
        let mut done = done;
        done.sort_by_key(|(key, job)| (job.started_ns, key.pid));
        let mut ids = Vec::new();
        for (key, mut job) in done {
            let begun = job.begun.take();
            let header = self.header(key, &job);
            let (rules, journal) = job.rules.into_parts();
            if rules.is_empty() {
                if let Some(j) = journal {
                    j.remove();
                }
                continue;
            }
            let record = record(header, rules, &job.log, &self.rules_of_steps(), all);
            let record = JobRecord {
                incomplete: !job.root_gone,
                ..record
            };
            match self.writer.record_begun(begun, record) {
                Ok(id) => {
                    ids.push(id);
                    if let Some(j) = journal {
                        j.remove();
                    }
                }
                // Left for the next roar command to recover, once this daemon is gone.
                Err(e) => tracing::error!("roarfs: cannot record a job: {e}"),
            }
        }
        ids
    }

    /// Records `machine` with every job.
    pub fn with_machine(mut self, machine: Option<roar_store::Runtime>) -> Jobs {
        self.machine = machine;
        self
    }

    /// Cuts jobs into steps by `rule`.
    pub fn with_steps(mut self, rule: roar_tracer::steps::Rule) -> Jobs {
        self.rule = rule;
        self
    }

    /// The device the mount's files show and where it is, once it is mounted.
    pub fn set_mount(&self, dev: u64, path: PathBuf) {
        let _ = self.mount.set((dev, path));
    }

    fn mount(&self) -> &(u64, PathBuf) {
        static NONE: (u64, PathBuf) = (0, PathBuf::new());
        self.mount.get().unwrap_or(&NONE)
    }

    fn mount_dev(&self) -> u64 {
        self.mount().0
    }

    /// What the job's row says while it runs (and, completed, once it has ended).
    fn header(&self, key: JobKey, job: &LiveJob) -> JobRecord {
        JobRecord {
            name: None,
            argv: job.argv.clone(),
            cwd: job.cwd.clone(),
            started_ns: job.started_ns,
            ended_ns: None,
            outcome: Outcome::Running,
            incomplete: false,
            backend: "mount".into(),
            git: None,
            env: Default::default(),
            host: self.host.clone(),
            processes: vec![ProcessRecord {
                pid: key.pid,
                parent_pid: None,
                exe: job.exe.clone(),
                argv: job.argv.clone(),
                started_ns: Some(job.started_ns),
                ended_ns: None,
            }],
            steps: Vec::new(),
            files: Vec::new(),
            environment: self.machine.clone().map(|rt| roar_store::Environment {
                runtime: Some(rt),
                ..Default::default()
            }),
            uid: Some(job.uid.clone()),
            dist: None,
        }
    }

    fn rules_of_steps(&self) -> Steps<'_> {
        Steps {
            ignore: &self.ignore,
            rule: &self.rule,
        }
    }

    pub fn flush(&self) {
        let _ = self.writer.flush();
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }
}

/// The rule's context for a job that started at `started_ns`: the project's ignore rules, the
/// job's start as the ctime floor (start times are clock ticks: a file the job made in its first
/// tick has a ctime at or after it), and no filesystem look-ups (the mount's paths lead back into
/// itself).
fn context<'a>(judge: &'a Judge<'a>, started_ns: i64) -> Context<'a> {
    static NO_DIRS: std::sync::LazyLock<roar_engine::HashSet<&'static Path>> =
        std::sync::LazyLock::new(roar_engine::HashSet::default);
    Context {
        dirs: &NO_DIRS,
        ctime_floor_ns: started_ns,
        ignore: judge,
        ask_filesystem: false,
    }
}

/// How a job's log is cut into steps: the paths never recorded and which programs begin steps.
pub struct Steps<'a> {
    pub ignore: &'a Ignore,
    pub rule: &'a roar_tracer::steps::Rule,
}

/// The job `header` began as, with the files `rules` left and the steps of `log`, ended now.
/// `unmounted`: the mount is gone, so paths name the backing files and an output whose last
/// release never arrived (releases are asynchronous; an unmount can overtake one) can be hashed
/// from the file itself.
fn record(
    header: JobRecord,
    rules: roar_engine::Rules,
    log: &steps::Log,
    steps: &Steps,
    unmounted: bool,
) -> JobRecord {
    let steps = log.steps(steps.ignore, header.started_ns, steps.rule);
    let classified = rules.finish();
    let mut files = Vec::new();
    for (path, st) in &classified.paths {
        for (role, version) in st.roles() {
            let hash = match version {
                Version::Prior => st.input.clone(),
                Version::Left => st.output().cloned().or_else(|| {
                    unmounted
                        .then(|| roar_store::hash::hash_path(path, Default::default()).ok())
                        .flatten()
                        .map(|h| h.hash)
                }),
                Version::Gone => None,
            };
            files.push(st.record(role, path.clone(), hash));
        }
    }
    JobRecord {
        ended_ns: Some(now_ns()),
        outcome: Outcome::Ended,
        files,
        steps,
        ..header
    }
}

/// A job of a mount daemon that died, rebuilt from its journal's records through the same rule
/// and step log the daemon had; `read_files`: the mount is gone, and outputs whose content the
/// daemon never saw are hashed from their files. None when the journal holds no header or the job touched
/// no recorded path. Its status is `killed`, ended at `last_ns` (the journal's last write),
/// unless the daemon saw its root process end (then it ended, and only its recording was lost).
pub fn recover(
    records: Vec<Record>,
    steps: &Steps,
    last_ns: i64,
    read_files: bool,
) -> Option<JobRecord> {
    let mut header: Option<JobRecord> = None;
    let mut rules = roar_engine::Rules::default();
    let mut log = steps::Log::default();
    let mut root_gone = false;
    let judge = Judge::Globs(steps.ignore);
    for r in records {
        match r {
            Record::Job(j) => header = Some(*j),
            Record::RootGone => root_gone = true,
            Record::Step(ev) => {
                // The kernel's report of the root's exit, read before the daemon died.
                let root = header
                    .as_ref()
                    .and_then(|h| h.processes.first())
                    .map(|p| p.pid);
                root_gone |= matches!(ev, Event::Exit { pid, .. } if Some(pid) == root);
                log.push(ev)
            }
            other => {
                let started = header.as_ref()?.started_ns;
                rules.replay(&context(&judge, started), &other);
                if let Record::Event(ev) = other {
                    log.push(ev);
                }
            }
        }
    }
    let header = header?;
    if rules.is_empty() {
        return None;
    }
    let job = record(header, rules, &log, steps, read_files);
    Some(JobRecord {
        ended_ns: Some(last_ns.max(job.started_ns)),
        outcome: if root_gone {
            Outcome::Ended
        } else {
            Outcome::Killed
        },
        incomplete: !root_gone,
        ..job
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_command_line_with_empty_arguments_exactly() {
        // The shell blocks reading its stdin until it is killed. /proc can show an empty command
        // line for a moment after spawn returns, or, before the exec, this test's own.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x", "sh", "", "x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut argv = cmdline(child.id() as i32);
        while argv.first().is_none_or(|a| a != "sh") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            argv = cmdline(child.id() as i32);
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(argv, ["sh", "-c", "read x", "sh", "", "x"]);
    }

    #[test]
    fn the_kernel_reports_a_process_exec_and_its_exit_with_when_it_exited_needs_root() {
        let events = match crate::sys::ExitEvents::open() {
            Ok(e) => e,
            Err(e) => {
                assert!(
                    std::env::var("CI").is_err(),
                    "process events need CAP_NET_ADMIN under CI=true: {e}"
                );
                return;
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(crate::sys::Exits::Seen { exits, execs, .. }) = events.wait(&mut buf) {
                if tx.send((exits, execs)).is_err() {
                    return;
                }
            }
        });
        let before = crate::sys::monotonic_ns();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let after = crate::sys::monotonic_ns();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // Its exec comes first (the socket keeps the kernel's order), then its exit.
        let mut execd = false;
        let exit = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let (exits, execs) = rx.recv_timeout(left).expect("the child's exit");
            execd |= execs.iter().any(|&(p, _)| p == pid);
            if let Some(e) = exits.into_iter().find(|e| e.tid == pid) {
                break e;
            }
        };
        assert!(execd, "the child's exec was reported before its exit");
        assert!(
            (before..=after).contains(&exit.at_ns),
            "exit stamped {} outside [{before}, {after}]",
            exit.at_ns
        );
    }

    #[test]
    fn reads_its_own_stat_line() {
        let me = read_proc_stat(std::process::id() as i32).unwrap().unwrap();
        assert!(me.start > 0);
        assert!(me.ppid > 0);
        assert_eq!(
            tgid(std::process::id() as i32).unwrap(),
            std::process::id() as i32
        );
    }
}
