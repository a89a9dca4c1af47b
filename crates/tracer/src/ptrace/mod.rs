//! The ptrace backend: a seccomp-bpf filter makes only file-namespace syscalls stop, so the traced
//! program runs at full speed between them; forks, clones and execs are followed with ptrace
//! options. Works for static and setuid programs, which the preload shim cannot enter.
//!
//! Each filtered syscall costs two stops: at entry (seccomp) its path arguments are read and
//! resolved against the tracee's cwd or dirfd; at exit its result decides whether it is reported.
//! A read-only open that repeats one the same program already made of the same file takes only
//! the first ([`reopens`]).
#![allow(unsafe_code)]

mod filter;
mod reopens;
mod syscalls;
mod wait;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use roar_store::now_ns;

use crate::event::Event;
use crate::keep::Keep;
use crate::launch::{self, Status};
use crate::{Tap, TraceError, Traced};
use filter::filter;
use reopens::Reopens;
use syscalls::{on_entry, on_exit, regs, Pending};

fn is_thread(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Tgid:")
                    .and_then(|v| v.trim().parse::<i32>().ok())
            })
        })
        .is_some_and(|tgid| tgid != tid)
}

fn cont(request: libc::c_uint, pid: i32, sig: i32) {
    // SAFETY: resuming a tracee of ours; failure means it is gone, which waitpid will report.
    unsafe { libc::ptrace(request, pid, 0, sig as libc::c_long) };
}

pub fn run(
    argv: &[OsString],
    env: &crate::EnvChanges,
    tap: &Tap,
    keep: &Keep,
) -> Result<Traced, TraceError> {
    // Each event is in the journal before the process that made it runs on: a roar killed at
    // any moment has kept every access the command made until then.
    let tap = &|ev: &Event| {
        tap(ev);
        keep.event(ev);
        keep.commit(None);
    };
    let guard = launch::SignalGuard::install();
    launch::become_subreaper();
    let mut cmd = launch::command(argv, env, &guard);
    traced_and_filtered(&mut cmd);
    let ctime_floor_ns = crate::ctime_floor_ns();
    keep.record(&roar_engine::journal::Record::CtimeFloor(ctime_floor_ns));
    keep.commit(None);
    let started_ns = now_ns();
    // exec happens before the first stop, so spawn returns (its error pipe closes on exec).
    let child = cmd.spawn().map_err(|e| launch::spawn_error(&argv[0], e))?;
    let root = child.id() as i32;
    guard.set_child(root);
    drop(child);

    let mut tracer = Tracer::new(root, tap);
    let mut stops = 0;
    let mut waiter = wait::Waiter::new();
    loop {
        let mut status = 0;
        let pid = waiter.next(&mut status);
        if pid < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => break,
                _ => {
                    return Err(TraceError::Wait {
                        source: io::Error::last_os_error(),
                    })
                }
            }
        }
        stops += u64::from(libc::WIFSTOPPED(status));
        tracer.waited(pid, status)?;
        waiter.served(status);
    }
    let ended_ns = now_ns();
    drop(guard);
    let untraced = crate::untraced_in(None, &tracer.events);
    Ok(Traced {
        untraced,
        events: tracer.events,
        status: tracer.root_status.unwrap_or(Status::Exited(0)),
        started_ns,
        ctime_floor_ns,
        ended_ns,
        malformed: tracer.malformed,
        cut_off: 0,
        lost: 0,
        forged: 0,
        unprivileged: tracer.unprivileged,
        cut_short: None,
        stops,
    })
}

/// Makes the command, between fork and exec, ask to be traced and install the seccomp filter
/// that makes only the file-namespace syscalls stop.
fn traced_and_filtered(cmd: &mut std::process::Command) {
    let prog = filter();
    // SAFETY: the closure runs between fork and exec and only makes raw syscalls.
    unsafe {
        cmd.pre_exec(move || {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Without CAP_SYS_ADMIN a filter needs no_new_privs (which also defuses setuid).
            if libc::geteuid() != 0 && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &fprog as *const _ as usize,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// What the trace loop knows between stops: the events so far and each tracee's state.
struct Tracer<'t> {
    tap: &'t dyn Fn(&Event),
    root: i32,
    events: Vec<Event>,
    pending: HashMap<i32, Pending>,
    reopens: Reopens,
    /// Processes (not threads) whose exit is reported.
    known: HashSet<i32>,
    /// Every tid whose first stop was seen.
    seen: HashSet<i32>,
    root_status: Option<Status>,
    options_set: bool,
    malformed: usize,
    /// The setuid programs the kernel ran without their privileges.
    unprivileged: Vec<PathBuf>,
}

impl<'t> Tracer<'t> {
    fn new(root: i32, tap: &'t dyn Fn(&Event)) -> Self {
        let mut tracer = Tracer {
            tap,
            root,
            events: Vec::new(),
            pending: HashMap::new(),
            reopens: Reopens::default(),
            known: HashSet::from([root]),
            seen: HashSet::from([root]),
            root_status: None,
            options_set: false,
            malformed: 0,
            // The command's own exec happened before the first stop.
            unprivileged: without_privileges(root).into_iter().collect(),
        };
        tracer.record(crate::from_proc::exec_event(root));
        tracer
    }

    fn record(&mut self, ev: Event) {
        (self.tap)(&ev);
        self.events.push(ev);
    }

    /// What `waitpid` reported of `pid`: an exit, or a stop to serve and resume.
    fn waited(&mut self, pid: i32, status: i32) -> Result<(), TraceError> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            self.exited(pid, status);
            return Ok(());
        }
        if !libc::WIFSTOPPED(status) {
            return Ok(());
        }
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if pid == self.root && !self.options_set {
            return self.first_stop(pid);
        }
        match (sig, event) {
            (libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP) => self.syscall_entry(pid),
            (
                libc::SIGTRAP,
                libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE,
            ) => self.forked(pid),
            (libc::SIGTRAP, libc::PTRACE_EVENT_EXEC) => self.execed(pid),
            (s, 0) if s == libc::SIGTRAP | 0x80 => self.syscall_exit(pid),
            (libc::SIGSTOP, 0) if !self.seen.contains(&pid) => {
                // The initial stop of an auto-attached child or thread (it may beat the fork event).
                self.seen.insert(pid);
                cont(libc::PTRACE_CONT, pid, 0);
            }
            (s, 0) => signal_stop(pid, s),
            _ => cont(libc::PTRACE_CONT, pid, 0),
        }
        Ok(())
    }

    fn exited(&mut self, pid: i32, status: i32) {
        self.pending.remove(&pid);
        self.reopens.exited(pid);
        if self.known.remove(&pid) {
            self.record(Event::Exit {
                pid,
                ts_ns: now_ns(),
            });
        }
        if pid == self.root {
            self.root_status = Some(Status::from_wait(status));
        }
    }

    /// The SIGTRAP of the first exec under PTRACE_TRACEME: now the options can be set, and the
    /// new program's credentials are in place.
    fn first_stop(&mut self, pid: i32) -> Result<(), TraceError> {
        self.options_set = true;
        self.reopens.exec(pid);
        let opts = libc::PTRACE_O_TRACESECCOMP
            | libc::PTRACE_O_TRACEFORK
            | libc::PTRACE_O_TRACEVFORK
            | libc::PTRACE_O_TRACECLONE
            | libc::PTRACE_O_TRACEEXEC
            | libc::PTRACE_O_TRACESYSGOOD
            | libc::PTRACE_O_EXITKILL;
        // SAFETY: setting options on our stopped tracee.
        if unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, pid, 0, opts as libc::c_long) } != 0 {
            return Err(TraceError::Ptrace {
                pid,
                source: io::Error::last_os_error(),
            });
        }
        cont(libc::PTRACE_CONT, pid, 0);
        Ok(())
    }

    /// A filtered syscall's entry: its paths are read now; its result is waited for unless a
    /// repeated open can be recorded at once.
    fn syscall_entry(&mut self, pid: i32) {
        match regs(pid).ok().and_then(|r| on_entry(pid, &r)) {
            Some(Pending::Open { path, flags }) => match self.reopens.repeat(pid, &path, flags) {
                Some(stat) => {
                    // Recorded now: its result would add nothing (see reopens).
                    self.record(Event::Open {
                        pid,
                        path,
                        flags,
                        stat: Some(stat),
                        ts_ns: now_ns(),
                    });
                    cont(libc::PTRACE_CONT, pid, 0);
                }
                None => {
                    self.pending.insert(pid, Pending::Open { path, flags });
                    cont(libc::PTRACE_SYSCALL, pid, 0);
                }
            },
            Some(p) => {
                self.pending.insert(pid, p);
                cont(libc::PTRACE_SYSCALL, pid, 0);
            }
            None => cont(libc::PTRACE_CONT, pid, 0),
        }
    }

    fn syscall_exit(&mut self, pid: i32) {
        match (self.pending.remove(&pid), regs(pid)) {
            (Some(p), Ok(r)) => {
                if let Some(ev) = on_exit(pid, p, r.rax as i64) {
                    self.reopens.saw(&ev);
                    self.record(ev);
                }
            }
            (Some(_), Err(_)) => self.malformed += 1,
            _ => {}
        }
        cont(libc::PTRACE_CONT, pid, 0);
    }

    fn forked(&mut self, pid: i32) {
        let mut new: libc::c_ulong = 0;
        // SAFETY: GETEVENTMSG writes one c_ulong.
        unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, pid, 0, &mut new) };
        let new = new as i32;
        if new > 0 {
            self.reopens.forked(pid, new);
        }
        if new > 0 && !is_thread(new) {
            self.known.insert(new);
            self.record(Event::Fork {
                pid: new,
                ppid: pid,
                ts_ns: now_ns(),
            });
        }
        cont(libc::PTRACE_CONT, pid, 0);
    }

    fn execed(&mut self, pid: i32) {
        // A thread other than the leader that execs takes the leader's id, and its own is never
        // reported as exited.
        let mut former: libc::c_ulong = 0;
        // SAFETY: GETEVENTMSG writes one c_ulong.
        unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, pid, 0, &mut former) };
        if former as i32 != pid && former > 0 {
            self.reopens.exited(former as i32);
        }
        self.known.insert(pid);
        if let Some(exe) = without_privileges(pid) {
            if !self.unprivileged.contains(&exe) {
                self.unprivileged.push(exe);
            }
        }
        let ev = crate::from_proc::exec_event(pid);
        self.reopens.exec(pid);
        self.record(ev);
        cont(libc::PTRACE_CONT, pid, 0);
    }
}

/// A signal for the tracee: delivered, unless the stop is a group-stop report.
fn signal_stop(pid: i32, s: i32) {
    // SAFETY: siginfo_t is plain data; GETSIGINFO fails (EINVAL) for group-stops.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: the tracee is stopped; GETSIGINFO writes one siginfo_t we own.
    let real = unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, pid, 0, &mut info) } == 0;
    cont(libc::PTRACE_CONT, pid, if real { s } else { 0 });
}

/// The program `pid` just exec'd, if it is setuid (setgid) to a user (group) the process is not
/// running as: the kernel runs it without those privileges under a tracer that lacks them.
fn without_privileges(pid: i32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let meta = std::fs::metadata(&exe).ok()?;
    let setuid = meta.mode() & libc::S_ISUID != 0;
    let setgid = meta.mode() & libc::S_ISGID != 0;
    if !setuid && !setgid {
        return None;
    }
    let status = procfs::process::Process::new(pid).ok()?.status().ok()?;
    let dropped = (setuid && status.euid != meta.uid()) || (setgid && status.egid != meta.gid());
    dropped.then_some(exe)
}
