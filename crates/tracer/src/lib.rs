//! The tracer backends behind `roar run`, and the classification of what a traced job touched.
//!
//! Every backend turns kernel or libc activity into [`Event`]s; [`collect`] turns events into the
//! store's file records. Backends: `preload` (LD_PRELOAD shim, default), `ptrace` (seccomp-filtered,
//! for static and setuid programs), `ebpf` (BTF raw tracepoints; static and setuid programs without
//! a stop per file). [`check`] is the deterministic preflight behind `roar tracer check` and
//! `--tracer auto`.

pub mod check;
pub mod collect;
pub mod early;
#[cfg(feature = "ebpf")]
mod ebpf;
#[cfg(not(feature = "ebpf"))]
#[path = "ebpf_absent.rs"]
mod ebpf;
pub mod event;
pub mod keep;
/// The ignore rule is the store's, shared with the mount.
pub use roar_store::ignore;
pub mod from_proc;
mod launch;
mod preload;
mod ptrace;
pub mod steps;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

pub use check::{check, choose, quick_check, Backend, Verdict};
/// The resident eBPF helper's entry point, and the first argument that selects it.
pub use ebpf::helper::{serve as ebpf_helper_main, HELPER_ARG as EBPF_HELPER_ARG};
pub use event::Event;
pub use from_proc::inside_roar;
pub use keep::Keep;
pub use launch::{detached, Status};
pub use preload::{late_path, left_behind, ring_path};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{cmd}: command not found")]
    NotFound { cmd: String },
    #[error("{cmd}: cannot execute")]
    NotExecutable {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {cmd}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the event socket or ring")]
    Socket {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot wait for the traced command")]
    Wait {
        #[source]
        source: std::io::Error,
    },
    #[error("ptrace failed on pid {pid}")]
    Ptrace {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("the {backend} tracer cannot run here: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
}

impl TraceError {
    /// Why a backend cannot run, in one line: an unavailable backend's own reason, else the
    /// error itself.
    pub(crate) fn reason(self) -> String {
        match self {
            TraceError::Unavailable { reason, .. } => reason,
            other => other.to_string(),
        }
    }
}

impl TraceError {
    /// The exit status a shell gives for this failure to start (127 not found, 126 not executable).
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            TraceError::NotFound { .. } => Some(127),
            TraceError::NotExecutable { .. } => Some(126),
            _ => None,
        }
    }
}

/// The kernel's coarse clock (`CLOCK_REALTIME_COARSE`), the clock inode timestamps are taken
/// from (the multigrain fine-grained stamps of kernels >= 6.13 are never below it). A file whose
/// ctime is at least a reading taken before the job started was changed after it; comparing
/// ctime with the precise clock instead calls a file created in the job's first tick (4 ms at
/// HZ=250) older than the job.
pub fn ctime_floor_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: a valid out-pointer; CLOCK_REALTIME_COARSE needs no privilege.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts)
    };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// What a traced run produced.
#[derive(Debug)]
pub struct Traced {
    pub events: Vec<Event>,
    pub status: Status,
    pub started_ns: i64,
    /// [`ctime_floor_ns`] just before the command started: the ctime of any inode the job
    /// changes is at least this.
    pub ctime_floor_ns: i64,
    pub ended_ns: i64,
    /// Datagrams, stops or records that could not be decoded: the job is incomplete if non-zero.
    pub malformed: usize,
    /// Events whose process was killed in the middle of reporting them (preload's ring): that
    /// process's last access may be missing, so the job is incomplete if non-zero.
    pub cut_off: usize,
    /// Events the kernel could not hand over (eBPF ring buffer full): the job is incomplete if
    /// non-zero.
    pub lost: usize,
    /// Datagrams refused unread: without the run's key, or from a sender the kernel does not
    /// place in the run (preload's `Senders`). Nothing of them is in the record; since a process
    /// of the run that became another user and was gone before its datagram was read cannot be
    /// placed either, the job is incomplete if non-zero.
    pub forged: usize,
    /// Programs the job exec'd that the backend could not follow (preload: statically linked or
    /// setuid), each with why: their files are missing from the record, so the job is incomplete.
    pub untraced: Vec<(PathBuf, &'static str)>,
    /// setuid/setgid programs the job ran without their privileges, as the kernel runs them
    /// under an unprivileged ptrace: the job did not run as it would bare, so it is marked.
    pub unprivileged: Vec<PathBuf>,
    /// Why the backend stopped seeing events before the command ended (the eBPF helper died),
    /// if it did: the job is incomplete.
    pub cut_short: Option<&'static str>,
    /// ptrace: how many times the command stopped for roar (each a round trip between the
    /// command and the tracer, what `--timing` reports per run); 0 for the other backends.
    pub stops: u64,
}

impl Traced {
    /// Whether some of what the command did may be missing from `events`.
    pub fn incomplete(&self) -> bool {
        self.malformed > 0
            || self.cut_off > 0
            || self.lost > 0
            || !self.untraced.is_empty()
            || !self.unprivileged.is_empty()
            || self.cut_short.is_some()
            || self.forged > 0
    }
}

/// Environment changes for the traced command: set (Some) or remove (None) each variable.
pub type EnvChanges = [(OsString, Option<OsString>)];

/// Sees every event as the backend receives it, while the command still runs (for work that can
/// start before the end, like [`early`] hashing). Called from the backend's receiving thread, so it
/// must be quick; events from processes without the preload ring may come slightly out of order.
pub type Tap = Arc<dyn Fn(&Event) + Send + Sync>;

/// Why a process's files may be missing although the backend followed it: it set up io_uring,
/// whose opens, reads and writes are requests in shared memory the kernel runs for it, never
/// system calls a tracer sees (SEMANTICS.md, blind spots). `roar mount` sees them: they reach
/// the filesystem like any other.
pub const IO_URING: &str = "it set up io_uring, whose file operations no tracer sees";

/// What to do about a program the backend could not follow, by why.
pub fn remedy(why: &str) -> &'static str {
    if why == IO_URING {
        "record it through `roar mount`, which sees io_uring's file operations"
    } else {
        "use --tracer ebpf or ptrace"
    }
}

/// The programs of `events` the backend could not follow (or whose files it could not see),
/// once each, after `top` (the command itself, judged before it ran).
pub fn untraced_in(
    top: Option<(PathBuf, &'static str)>,
    events: &[Event],
) -> Vec<(PathBuf, &'static str)> {
    let mut out: Vec<(PathBuf, &'static str)> = top.into_iter().collect();
    for e in events {
        if let Event::Untraced { path, why, .. } = e {
            if !out.iter().any(|(p, w)| p == path && w == why) {
                out.push((path.clone(), why));
            }
        }
    }
    out
}

/// How long a command runs before work beside it starts: the preload receiver's thread, and the
/// caller's ([`Beside::running_on`]: the dirty check). Most commands roar runs end sooner, and a
/// thread started for them costs its start, a wake-up and its exit, ~0.1 ms of a short run
/// (bench/NOTES.md, "Two shared libraries fewer, threads only for commands that run on").
pub const BESIDE_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// The caller's work around its command, done on the run's thread while the command runs. Each
/// method is called at most once per [`run`].
pub trait Beside {
    /// The command is starting (at `started_ns`): work that needs nothing from it, done while it
    /// execs on another CPU rather than before it starts. Under preload right after the spawn
    /// (not at all if the spawn fails); under ptrace and eBPF, whose starts are their own, just
    /// before them.
    fn started(&mut self, started_ns: i64);
    /// The command runs on: work that would slow a short command down on two cores. Under
    /// preload once the command has run [`BESIDE_AFTER`] (never if it ends sooner), under ptrace
    /// and eBPF at once (their waits are not timed), so work it starts keeps its own delay from
    /// the command's start.
    fn running_on(&mut self);
}

/// Runs `argv` under `backend` with `env` applied to the inherited environment, showing each
/// event to `tap` as it arrives, and the caller's work `beside` the command. `preload_lib` is the
/// shim for the preload backend.
pub fn run(
    backend: Backend,
    argv: &[OsString],
    env: &EnvChanges,
    preload_lib: Option<&PathBuf>,
    tap: Tap,
    keep: Arc<Keep>,
    beside: &mut dyn Beside,
) -> Result<Traced, TraceError> {
    let traced = backends(backend, argv, env, preload_lib, tap, &keep, beside)?;
    // The command and every process it left are over, and every event is in the journal: a roar
    // killed from here on leaves a journal that holds the whole job.
    if !traced.incomplete() {
        keep.record(&roar_engine::journal::Record::RootGone);
        keep.commit(None);
    }
    Ok(traced)
}

fn backends(
    backend: Backend,
    argv: &[OsString],
    env: &EnvChanges,
    preload_lib: Option<&PathBuf>,
    tap: Tap,
    keep: &Arc<Keep>,
    beside: &mut dyn Beside,
) -> Result<Traced, TraceError> {
    match backend {
        Backend::Preload => {
            let lib = preload_lib.ok_or_else(|| TraceError::Unavailable {
                backend: "preload",
                reason: "libroar_preload.so was not found".into(),
            })?;
            preload::run(argv, env, lib, tap, keep.clone(), beside)
        }
        Backend::Ptrace => {
            beside.started(roar_store::now_ns());
            beside.running_on();
            ptrace::run(argv, env, &tap, keep)
        }
        Backend::Ebpf => {
            beside.started(roar_store::now_ns());
            beside.running_on();
            ebpf::run(argv, env, &tap, keep)
        }
    }
}
