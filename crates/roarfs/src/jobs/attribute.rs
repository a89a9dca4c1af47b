//! Which job a request through the mount belongs to: the caller's process read from /proc,
//! walked up to its job's root (the rule in the parent module's doc), with the kernel's process
//! events telling whose fork a re-parented orphan is (a daemon's double fork) and when a cached
//! thread id was freed for another.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;

use super::{births, steps, Cached, JobKey, Jobs};

#[derive(Debug, Clone)]
pub(super) struct ProcInfo {
    pub(super) pid: i32,
    pub(super) ppid: i32,
    pgid: i32,
    pub(super) start: u64,
    comm: String,
    /// Its state letter: `Z` (zombie) or `X` (dead) once it has exited.
    state: char,
}

impl ProcInfo {
    fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// A process's stat line; `Ok(None)` when there is no such process (any more). Any other
/// failure to read it (descriptors or memory exhausted) is an error the caller must not take
/// for "not a process of any job".
pub(super) fn read_proc_stat(pid: i32) -> io::Result<Option<ProcInfo>> {
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
        state: stat.state,
    })
}

/// `cur`'s parent process, read after `cur` was: None only at the top (pid 1's parent) or when
/// `cur` itself has gone. A parent gone between the two reads, or whose id now shows another
/// process (a daemon's middle process exiting while its child's request is attributed), was not
/// the top: `cur` is read again, re-parented (to init or a subreaper), and its parent now is
/// read. Taking the vanished parent for the top made such a daemon the root of a job of its own.
fn parent_of(cur: &ProcInfo) -> io::Result<Option<ProcInfo>> {
    let mut cur = cur.clone();
    // Each retry follows one more re-parenting (an ancestor chain exiting while it is read).
    for _ in 0..8 {
        // A parent started after `cur` is another process given the gone parent's id.
        if let Some(parent) = read_proc_stat(cur.ppid)?.filter(|p| p.start <= cur.start) {
            return Ok(Some(parent));
        }
        match read_proc_stat(cur.pid)? {
            Some(now) if now.start == cur.start && now.ppid != cur.ppid => cur = now,
            _ => return Ok(None),
        }
    }
    Ok(None)
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
pub(super) fn cmdline(pid: i32) -> Vec<OsString> {
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
    same_program(ea == eb, cmdline_bytes(a), cmdline_bytes(b))
}

/// [`same_program_seen`] from what /proc showed: whether the two exes were the same, then each
/// command line. A process that exits between the reads shows its exe, then an empty command
/// line (its memory is gone): that is not known, not a different program — taken as different,
/// a daemon's middle process exiting at that moment made the daemon a job of its own.
fn same_program(same_exe: bool, a: Option<Vec<u8>>, b: Option<Vec<u8>>) -> Option<bool> {
    let shown = |c: Option<Vec<u8>>| c.filter(|c| !c.is_empty());
    match (shown(a), shown(b)) {
        (Some(a), Some(b)) => Some(same_exe && a == b),
        _ => None,
    }
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

/// The longest an orphan's first request waits for the reader of the kernel's events to say
/// whether its fork was seen (`Jobs::birth_of`): the reader answers as soon as it runs, so this
/// bounds only a reader starved of a CPU (it was the whole wait, 500 ms, before the reader answered).
const BIRTH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Jobs {
    /// The job of the calling thread `tid`, or None for processes the mount does not record
    /// (and for a caller outside the daemon's pid namespace, which FUSE reports as pid 0). An
    /// error when the caller's /proc entries cannot be read.
    pub fn job_of(&self, tid: u32) -> io::Result<Option<JobKey>> {
        let tid = tid as i32;
        if tid <= 0 {
            return Ok(None);
        }
        let watched = self
            .exits_watched
            .load(std::sync::atomic::Ordering::Acquire);
        let cached = self
            .inner
            .lock()
            .expect("jobs lock")
            .by_tid
            .get(&tid)
            .copied();
        if let Some(c) = cached.filter(|c| watched && !c.exited) {
            return Ok(c.job);
        }
        let Some(me) = read_proc_stat(tid)? else {
            // An exited thread's own late request (its id not given to another yet).
            return Ok(cached.filter(|c| c.exited).and_then(|c| c.job));
        };
        if let Some(c) = cached.filter(|c| c.start == me.start) {
            return Ok(c.job);
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
                exited: false,
            },
        );
        drop(inner);
        if watched {
            self.seen_alive_after_cached(tid, me.start);
        }
        Ok(job)
    }

    /// Whether thread `tid`, just cached with start time `start`, is still alive; if not, its
    /// entry is marked exited. While process events are read, a cached thread is trusted without
    /// /proc until its exit's event removes it — but a thread that exited while its request was
    /// attributed may have had that event read before its entry existed: nothing would remove
    /// the entry, and after a pid wrap the thread given its id would be taken for this one (a
    /// daemon's write recorded in an old program's job). The kernel marks a thread exited (`Z`,
    /// `X`, or gone from /proc) before it queues the exit's event (`exit_notify` comes before
    /// `proc_exit_connector`), and the entry was made before this read: a thread seen alive
    /// here has its event still to come, and the reader will find the entry. A marked entry
    /// still answers the thread's own late requests (queued readahead, a flush at exit) while
    /// /proc shows it dead or no thread with its id; a thread with another start re-attributes.
    /// An unreadable /proc (descriptors exhausted) is taken as not seen alive.
    fn seen_alive_after_cached(&self, tid: i32, start: u64) {
        let alive = matches!(read_proc_stat(tid), Ok(Some(p)) if p.start == start && !p.exited());
        if !alive {
            let mut inner = self.inner.lock().expect("jobs lock");
            if let Some(c) = inner.by_tid.get_mut(&tid).filter(|c| c.start == start) {
                c.exited = true;
            }
        }
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
        if let Ok(poke) = events.poke() {
            let _ = self.poke.set(poke);
        }
        let weak = std::sync::Arc::downgrade(self);
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
                    let Some(jobs) = weak.upgrade() else { return };
                    // The questions asked before this read are answered if it finds nothing.
                    let asked = jobs.drains.asked();
                    let seen = events.next(&mut buf);
                    if let Ok(crate::sys::Exits::Drained) = seen {
                        jobs.drains.drained(asked);
                        drop(jobs);
                        if let Err(e) = events.block() {
                            if let Some(jobs) = weak.upgrade() {
                                jobs.events_read(Err(e));
                            }
                            return;
                        }
                    } else if !jobs.events_read(seen) {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            self.exits_watched
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// What the reader of process events read: false when the events stopped.
    fn events_read(&self, seen: io::Result<crate::sys::Exits>) -> bool {
        // Start times are clock ticks of CLOCK_BOOTTIME; exits are stamped with
        // CLOCK_MONOTONIC (they differ by the time the machine was suspended).
        let suspended = crate::sys::boottime_minus_monotonic_ns();
        let mut inner = self.inner.lock().expect("jobs lock");
        match seen {
            Ok(crate::sys::Exits::Seen {
                forks,
                exits,
                execs,
            }) => {
                for f in forks {
                    let at = self.tick(f.at_ns, suspended);
                    inner.births.forked(f.parent, f.child, at);
                }
                for &(pid, _) in &execs {
                    inner.births.execd(pid);
                }
                for e in exits {
                    let tick = self.tick(e.at_ns, suspended);
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
                    self.exec_seen(pid);
                }
            }
            // Exit events were lost (the kernel reports every process of the machine: a busy
            // one overflows the socket). What is lost is which cached threads ended, not which
            // still run: keep those /proc shows alive with the same start time. Clearing the
            // cache instead forgot a job's members, and a forked worker outliving its root then
            // had its job recorded early and its later writes made a job of their own.
            Ok(crate::sys::Exits::Lost) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| tracing::warn!("roarfs: process events were lost (the reader fell behind the machine's forks): a daemon forked before now is attributed by /proc alone"));
                inner.births.lost(self.now_tick());
                inner.by_tid.retain(
                    |tid, c| matches!(read_proc_stat(*tid), Ok(Some(p)) if p.start == c.start),
                )
            }
            Ok(crate::sys::Exits::Drained) => {}
            Err(e) => {
                // Without events the cache cannot be trusted: back to /proc.
                self.exits_watched
                    .store(false, std::sync::atomic::Ordering::Release);
                inner.by_tid.clear();
                tracing::error!(
                    "roarfs: process events stopped ({e}): attribution reads /proc per request"
                );
                return false;
            }
        }
        true
    }

    /// Whether a thread of `key`'s job other than its root is still alive (a forked worker
    /// outliving the root keeps the job open, as `roar run` waits for every descendant).
    pub(super) fn members_alive(by_tid: &HashMap<i32, Cached>, key: &JobKey) -> bool {
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
        while let Some(parent) = parent_of(&cur)? {
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
                    match parent_of(&up)? {
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

    /// `cur`'s fork as the kernel reported it; with `wait`, asking the reader of its events to
    /// read everything queued and waiting until it has — microseconds on an idle machine, tens of
    /// milliseconds behind a loaded one — and only then saying it will never be known (its fork
    /// event was queued before it first ran, so before this request). `BIRTH_WAIT` bounds a
    /// reader that is not scheduled at all. Only an orphan's first request ever waits.
    fn birth_of(&self, cur: &ProcInfo, wait: bool) -> Option<births::Birth> {
        let deadline = std::time::Instant::now() + BIRTH_WAIT;
        let mut asked = None;
        while self
            .exits_watched
            .load(std::sync::atomic::Ordering::Acquire)
        {
            // Answered before reading the births: what the answer covers is in them.
            let answered = asked.is_some_and(|q| self.drains.answers(q));
            let known =
                (self.inner.lock().expect("jobs lock").births).of(cur.pid, cur.start as i64);
            match known {
                births::Known::Born(b) => return Some(b),
                births::Known::NotYet
                    if wait && !answered && std::time::Instant::now() < deadline =>
                {
                    if asked.is_none() {
                        asked = Some(self.drains.ask());
                        if let Some(poke) = self.poke.get() {
                            poke.poke();
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50))
                }
                _ => return None,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's process events, or None (said) where they cannot be had outside CI.
    fn process_events() -> Option<crate::sys::ExitEvents> {
        match crate::sys::ExitEvents::open() {
            Ok(e) => Some(e),
            Err(e) => {
                assert!(
                    std::env::var("CI").is_err(),
                    "process events need CAP_NET_ADMIN under CI=true: {e}"
                );
                eprintln!("skipped: no process events here ({e})");
                None
            }
        }
    }

    #[test]
    fn a_command_line_gone_between_two_reads_is_not_known_rather_than_another_program() {
        let argv = || Some(b"python3\0prog.py\0".to_vec());
        assert_eq!(same_program(true, argv(), argv()), Some(true));
        assert_eq!(same_program(false, argv(), argv()), Some(false));
        let other = Some(b"python3\0other.py\0".to_vec());
        assert_eq!(same_program(true, argv(), other), Some(false));
        // Exited after its exe was read: no command line any more.
        assert_eq!(same_program(true, argv(), Some(Vec::new())), None);
        assert_eq!(same_program(true, Some(Vec::new()), Some(Vec::new())), None);
        assert_eq!(same_program(true, None, argv()), None);
    }

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
    fn once_the_reader_drains_after_a_process_ran_its_fork_has_been_read_needs_root() {
        // What lets an orphan's request stop waiting as soon as the reader answers: the kernel
        // queues a fork's event before the child first runs.
        let Some(events) = process_events() else {
            return;
        };
        let poke = events.poke().unwrap();
        let drains = std::sync::Arc::new(births::Drains::default());
        let forked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (d, f) = (drains.clone(), forked.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let asked = d.asked();
                match events.next(&mut buf).unwrap() {
                    crate::sys::Exits::Drained => {
                        d.drained(asked);
                        events.block().unwrap();
                    }
                    crate::sys::Exits::Seen { forks, .. } => {
                        f.lock().unwrap().extend(forks.iter().map(|f| f.child))
                    }
                    crate::sys::Exits::Lost => f.lock().unwrap().push(-1),
                }
            }
        });
        for _ in 0..50 {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let pid = child.id() as i32;
            child.wait().unwrap();
            let q = drains.ask();
            poke.poke();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !drains.answers(q) {
                assert!(std::time::Instant::now() < deadline, "never answered");
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            let forked = forked.lock().unwrap();
            // Events lost to a busy machine (-1) prove nothing either way.
            assert!(
                forked.contains(&pid) || forked.contains(&-1),
                "answered before reading the fork of {pid}"
            );
        }
    }

    #[test]
    fn a_reader_away_while_a_thousand_processes_start_and_end_loses_no_event_needs_root() {
        // 3,000 events (fork, exec, exit each) queued unread: the default buffer held ~200.
        let Some(events) = process_events() else {
            return;
        };
        let mut pids = std::collections::HashSet::new();
        for _ in 0..1000 {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            pids.insert(child.id() as i32);
            child.wait().unwrap();
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match events.next(&mut buf).unwrap() {
                crate::sys::Exits::Seen { exits, .. } => {
                    for e in exits {
                        pids.remove(&e.tid);
                    }
                }
                crate::sys::Exits::Lost => panic!("events lost while the reader was away"),
                crate::sys::Exits::Drained => break,
            }
        }
        assert!(pids.is_empty(), "{} exits never read", pids.len());
    }

    #[test]
    fn the_kernel_reports_a_process_exec_and_its_exit_with_when_it_exited_needs_root() {
        let Some(events) = process_events() else {
            return;
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

    /// A request attributed while its thread exits, the exit's event read first: nothing will
    /// remove the thread's entry, so it is marked and never trusted without /proc. It still
    /// answers the dead thread's own requests; a thread with another start under its id is
    /// attributed afresh. A live thread's entry is trusted.
    #[test]
    fn a_thread_cached_after_its_exit_was_read_is_not_taken_for_a_later_thread_with_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("roar.db");
        roar_store::open(&db, true).unwrap();
        let writer = roar_store::Writer::start(&db).unwrap();
        let jobs = Jobs::new(writer, roar_store::ignore::Ignore::new(&[]));
        jobs.exits_watched
            .store(true, std::sync::atomic::Ordering::Release);
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (gone_pid, live_pid) = (gone.id() as i32, live.id() as i32);
        // Exited, not reaped: /proc still shows it, as it does a caller exiting mid-request.
        let zombie = || read_proc_stat(gone_pid).is_ok_and(|p| p.is_some_and(|p| p.exited()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(zombie(), "`true` did not exit within 10 s");
        // Its exit's event was read before its request (no entry then: nothing removed).
        jobs.events_read(Ok(crate::sys::Exits::Seen {
            forks: Vec::new(),
            exits: vec![crate::sys::Exit {
                tid: gone_pid,
                at_ns: crate::sys::monotonic_ns(),
            }],
            execs: Vec::new(),
        }));
        let first = jobs.job_of(gone_pid as u32).unwrap();
        let live_job = jobs.job_of(live_pid as u32).unwrap();
        let entry = |tid: i32| jobs.inner.lock().unwrap().by_tid.get(&tid).copied();
        assert!(
            entry(gone_pid).unwrap().exited,
            "the dead thread's entry is not marked"
        );
        assert!(
            !entry(live_pid).unwrap().exited,
            "a live thread's entry is marked"
        );
        assert_eq!(
            jobs.job_of(gone_pid as u32).unwrap(),
            first,
            "its own late request"
        );
        gone.wait().unwrap();
        assert_eq!(
            jobs.job_of(gone_pid as u32).unwrap(),
            first,
            "reaped, id not reused"
        );
        // The id given to another thread (here: the live one's id, its entry made stale and
        // marked as it would be): the new thread is attributed afresh, not given the old job.
        let old = JobKey { pid: 1, start: 1 };
        let before = entry(live_pid).unwrap().start - 1;
        let stale = |exited| Cached {
            start: before,
            job: Some(old),
            pid: live_pid,
            exited,
        };
        let marked = stale(true);
        jobs.inner.lock().unwrap().by_tid.insert(live_pid, marked);
        assert_eq!(jobs.job_of(live_pid as u32).unwrap(), live_job);
        // Unmarked, the same entry is trusted: what the mark prevents.
        let unmarked = stale(false);
        jobs.inner.lock().unwrap().by_tid.insert(live_pid, unmarked);
        assert_eq!(jobs.job_of(live_pid as u32).unwrap(), Some(old));
        live.kill().unwrap();
        live.wait().unwrap();
    }

    /// A process whose parent, as first read, is gone since: its parent now is found (a daemon's
    /// middle process exiting while its child's request is attributed).
    #[test]
    fn a_parent_gone_between_two_reads_is_followed_to_the_one_that_adopted_the_process() {
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id() as i32;
        gone.wait().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut read = read_proc_stat(child.id() as i32).unwrap().unwrap();
        // As read just before its parent exited and was reaped.
        read.ppid = gone_pid;
        let parent = parent_of(&read).unwrap().expect("its parent now");
        assert_eq!(parent.pid, std::process::id() as i32);
        // The top has no parent; a process gone itself has none to find.
        let init = read_proc_stat(1).unwrap().unwrap();
        assert!(parent_of(&init).unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(parent_of(&read).unwrap().is_none());
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
