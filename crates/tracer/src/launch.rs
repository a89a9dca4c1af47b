//! Starting the traced command exactly as if it ran bare: signals, exit status, orphans.
//!
//! roar ignores SIGINT/SIGQUIT while the command runs (the terminal delivers them to the command,
//! which shares our process group) and forwards SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 sent to roar itself.
//! roar becomes a child subreaper so processes the command leaves behind are still part of the
//! job: `roar run` returns once every one of them has exited.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::TraceError;

/// How the traced command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
}

impl Status {
    /// The exit code a shell would report: the code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            Status::Exited(c) => c,
            Status::Signaled(s) => 128 + s,
        }
    }

    pub(crate) fn from_wait(status: libc::c_int) -> Status {
        if libc::WIFSIGNALED(status) {
            Status::Signaled(libc::WTERMSIG(status))
        } else {
            Status::Exited(libc::WEXITSTATUS(status))
        }
    }
}

static CHILD: AtomicI32 = AtomicI32::new(0);
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2];
const IGNORED: [libc::c_int; 2] = [libc::SIGINT, libc::SIGQUIT];

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Signal dispositions roar changed, put back on drop.
pub(crate) struct SignalGuard {
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    pub(crate) fn install() -> SignalGuard {
        let mut saved = Vec::new();
        for (sig, handler) in
            IGNORED
                .iter()
                .map(|s| (*s, libc::SIG_IGN))
                .chain(FORWARDED.iter().map(|s| {
                    (
                        *s,
                        forward as extern "C" fn(libc::c_int) as libc::sighandler_t,
                    )
                }))
        {
            // SAFETY: sigaction with a zeroed (then filled) struct; the old one is saved to restore.
            unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = handler;
                new.sa_flags = libc::SA_RESTART;
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &new, &mut old) == 0 {
                    saved.push((sig, old));
                }
            }
        }
        SignalGuard { saved }
    }

    pub(crate) fn set_child(&self, pid: i32) {
        CHILD.store(pid, Ordering::Relaxed);
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        CHILD.store(0, Ordering::Relaxed);
        for (sig, old) in &self.saved {
            // SAFETY: restoring a disposition sigaction gave us.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}

/// The dispositions the command must start with: those roar itself was started with.
pub(crate) fn original_dispositions(guard: &SignalGuard) -> Vec<(libc::c_int, libc::sighandler_t)> {
    guard
        .saved
        .iter()
        .map(|(sig, old)| {
            let h = if old.sa_sigaction == libc::SIG_IGN {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            (*sig, h)
        })
        .collect()
}

/// A Command for `argv` with `env` applied, whose child restores the caller's signal
/// dispositions before exec.
pub(crate) fn command(
    argv: &[OsString],
    env: &crate::EnvChanges,
    dispositions: Vec<(libc::c_int, libc::sighandler_t)>,
) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    // SAFETY: the closure only calls async-signal-safe functions (signal).
    unsafe {
        cmd.pre_exec(move || {
            for (sig, h) in &dispositions {
                libc::signal(*sig, *h);
            }
            Ok(())
        });
    }
    cmd
}

pub(crate) fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

pub(crate) fn spawn_error(argv0: &OsString, e: io::Error) -> TraceError {
    let cmd = argv0.to_string_lossy().into_owned();
    match e.kind() {
        io::ErrorKind::NotFound => TraceError::NotFound { cmd },
        io::ErrorKind::PermissionDenied => TraceError::NotExecutable { cmd, source: e },
        _ => TraceError::Spawn { cmd, source: e },
    }
}

/// Waits for `pid`, retrying on EINTR.
pub(crate) fn wait_for(pid: i32) -> io::Result<Status> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(Status::from_wait(status));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Reaps every remaining descendant (re-parented to us as subreaper) until none is left.
pub(crate) fn reap_orphans() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}
