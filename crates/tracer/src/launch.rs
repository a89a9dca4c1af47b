//! Starting the traced command exactly as if it ran bare: lookup, signals, exit status, orphans.
//! docs/SEMANTICS.md ("How the command starts") says what the command inherits.
//!
//! roar ignores SIGINT/SIGQUIT while the command runs (the terminal delivers them to the command,
//! which shares our process group) and forwards SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 sent to roar itself.
//! roar becomes a child subreaper so processes the command leaves behind are still part of the
//! job: `roar run` returns once every one of them has exited.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

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
/// Signals sent to roar that are the command's: passed on (SIGWINCH: a resize told to roar
/// alone, as `kill -WINCH` or a terminal multiplexer does; SIGALRM, SIGVTALRM and SIGPWR: timers
/// and notices; SIGCONT: roar continued alone).
const FORWARDED: [libc::c_int; 9] = [
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPWR,
    libc::SIGCONT,
];
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
    /// Ignores SIGINT/SIGQUIT and forwards SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 to the command, except
    /// a signal roar was started ignoring: that one stays ignored, for roar and for the command.
    pub(crate) fn install() -> SignalGuard {
        let mut saved = Vec::new();
        let forward = forward as extern "C" fn(libc::c_int) as libc::sighandler_t;
        let wanted = IGNORED
            .iter()
            .map(|s| (*s, libc::SIG_IGN))
            .chain(FORWARDED.iter().map(|s| (*s, forward)));
        for (sig, handler) in wanted {
            // SAFETY: sigaction with zeroed (then filled) structs; the old one is saved to restore.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = handler;
                new.sa_flags = libc::SA_RESTART;
                if libc::sigaction(sig, &new, std::ptr::null_mut()) == 0 {
                    saved.push((sig, old));
                }
            }
        }
        SignalGuard { saved }
    }

    pub(crate) fn set_child(&self, pid: i32) {
        CHILD.store(pid, Ordering::Relaxed);
    }

    /// The signals the command must start at their default action: those roar ignores while it
    /// runs (the forwarded ones have handlers, which exec resets), and SIGPIPE unless roar was
    /// started ignoring it (roar's start ignores it for itself). Everything else the command
    /// inherits as roar was started with: ignored signals, the signal mask.
    fn reset_on_exec(&self) -> Vec<libc::c_int> {
        let ignored_by_roar = self.saved.iter().map(|(sig, _)| *sig);
        let pipe = (!STARTED_IGNORING_SIGPIPE.load(Ordering::Relaxed)).then_some(libc::SIGPIPE);
        ignored_by_roar
            .filter(|sig| IGNORED.contains(sig))
            .chain(pipe)
            .collect()
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

/// Which of fds 0, 1, 2 were closed when roar started (bit N: fd N), so the command gets them
/// closed too. roar's start opens /dev/null on closed standard fds before `main` (so that its
/// own files never land there); this is read before that, from `.init_array`, which the C runtime
/// runs first.
static CLOSED_STDIO: AtomicU8 = AtomicU8::new(0);

/// Whether roar was started with SIGPIPE ignored (by `nohup`-like runners, `subprocess` with
/// `restore_signals=False`): read at the same time, before roar ignores it for itself.
static STARTED_IGNORING_SIGPIPE: AtomicBool = AtomicBool::new(false);

/// Which of glibc's own signals 32 (bit 0) and 33 (bit 1) roar was started with ignored (by a
/// parent that used posix_spawn, which leaves them so): the command then starts so too.
static STARTED_IGNORING_GLIBC_OWN: AtomicU8 = AtomicU8::new(0);

extern "C" fn record_closed_stdio() {
    let mut closed = 0;
    for fd in 0..3 {
        // SAFETY: F_GETFD on any integer is safe; EBADF says it is not open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            closed |= 1 << fd;
        }
    }
    CLOSED_STDIO.store(closed, Ordering::Relaxed);
    // SAFETY: sigaction only reads the disposition into a zeroed struct.
    let ignored = |sig: libc::c_int| unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    };
    STARTED_IGNORING_SIGPIPE.store(ignored(libc::SIGPIPE), Ordering::Relaxed);
    // glibc's sigaction refuses its own two signals: the kernel's, with its action layout
    // (handler, flags, restorer, mask).
    let ignored_raw = |sig: libc::c_long| {
        let mut old = [0u64; 4];
        // SAFETY: rt_sigaction only writes the current action into `old` (32 bytes, the
        // kernel's struct for an 8-byte mask).
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                0usize,
                old.as_mut_ptr(),
                8usize,
            )
        };
        r == 0 && old[0] as libc::sighandler_t == libc::SIG_IGN
    };
    let own = u8::from(ignored_raw(32)) | (u8::from(ignored_raw(33)) << 1);
    STARTED_IGNORING_GLIBC_OWN.store(own, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static RECORD_CLOSED_STDIO: extern "C" fn() = record_closed_stdio;

/// The standard fds that were closed when roar started.
pub(crate) fn closed_stdio() -> Vec<libc::c_int> {
    // Referencing the constructor keeps its object in the link.
    std::hint::black_box(&RECORD_CLOSED_STDIO);
    let closed = CLOSED_STDIO.load(Ordering::Relaxed);
    (0..3).filter(|fd| closed & (1 << fd) != 0).collect()
}

/// A Command for `argv` with `env` applied, forked so that a backend can act in the child before
/// exec (ptrace, eBPF); its child starts with the signal state `guard` describes. The preload
/// backend, which needs nothing in the child, uses [`spawn`].
pub(crate) fn command(argv: &[OsString], env: &crate::EnvChanges, guard: &SignalGuard) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let reset = guard.reset_on_exec();
    let closed = closed_stdio();
    // std's spawn resets SIGPIPE to its default before this closure runs; one roar was started
    // ignoring stays ignored for the command.
    let keep_pipe_ignored = STARTED_IGNORING_SIGPIPE.load(Ordering::Relaxed);
    // SAFETY: the closure only calls async-signal-safe functions (signal, close).
    unsafe {
        cmd.pre_exec(move || {
            for sig in &reset {
                libc::signal(*sig, libc::SIG_DFL);
            }
            if keep_pipe_ignored {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            for fd in &closed {
                libc::close(*fd);
            }
            Ok(())
        });
    }
    cmd
}

/// Starts `argv` with `env` applied and returns its pid, the child starting with the signal state
/// `guard` describes.
///
/// posix_spawn rather than fork: glibc starts the child with clone(CLONE_VM|CLONE_VFORK), which
/// does not copy roar's page tables as fork does, nor leave roar copy-on-write faults to take
/// after it (~85 fewer page faults per `roar run true`). Because posix_spawnp neither runs a
/// script without a `#!` line nor searches the child's PATH (it reads roar's), the program is
/// looked up here as execvp does: a name with a slash is run as is; otherwise each PATH entry
/// (the child's PATH; "/bin:/usr/bin" without one; an empty entry is the current directory) is
/// tried in order, passing over entries where it is missing or not executable (EACCES is
/// reported if nothing ran and one of them existed); a file the kernel will not exec (ENOEXEC)
/// is run by /bin/sh.
pub(crate) fn spawn(
    argv: &[OsString],
    env: &crate::EnvChanges,
    guard: &SignalGuard,
) -> io::Result<i32> {
    let args = cstrings(argv.iter().map(|a| a.as_bytes().to_vec()))?;
    let vars = environment(env);
    let envp = cstrings(
        vars.iter()
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat()),
    )?;
    let attr = SpawnAttr::new(&guard.reset_on_exec())?;
    let actions = FileActions::closing(&closed_stdio())?;
    let run = |path: &[u8]| spawn_file(path, &args, &envp, &attr, &actions);

    let prog = argv[0].as_bytes();
    if prog.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if prog.contains(&b'/') {
        return run(prog);
    }
    let search: &[u8] = vars
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(b"/bin:/usr/bin", |(_, v)| v.as_bytes());
    let mut denied = false;
    for dir in search.split(|b| *b == b':') {
        let candidate = if dir.is_empty() {
            prog.to_vec()
        } else {
            [dir, b"/", prog].concat()
        };
        // A stat spares a clone for each entry where the program is not.
        if std::fs::metadata(OsStr::from_bytes(&candidate)).is_err_and(|e| passed_over(&e)) {
            continue;
        }
        match run(&candidate) {
            Ok(pid) => return Ok(pid),
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => denied = true,
            Err(e) if passed_over(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let errno = if denied { libc::EACCES } else { libc::ENOENT };
    Err(io::Error::from_raw_os_error(errno))
}

/// Errors after which execvp goes on to the next PATH entry.
fn passed_over(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT)
    )
}

/// roar's environment with `changes` applied: a variable set again replaces the one inherited.
fn environment(changes: &crate::EnvChanges) -> Vec<(OsString, OsString)> {
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (name, value) in changes {
        vars.retain(|(n, _)| n != name);
        if let Some(v) = value {
            vars.push((name.clone(), v.clone()));
        }
    }
    vars
}

fn cstrings(items: impl Iterator<Item = Vec<u8>>) -> io::Result<Vec<CString>> {
    items
        .map(|b| CString::new(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e)))
        .collect()
}

/// A null-terminated array of pointers into `items`, as execve takes it.
fn pointers(items: &[CString]) -> Vec<*mut libc::c_char> {
    items
        .iter()
        .map(|c| c.as_ptr().cast_mut())
        .chain([std::ptr::null_mut()])
        .collect()
}

/// posix_spawn attributes: `reset` at their default action in the child.
struct SpawnAttr(libc::posix_spawnattr_t);

impl SpawnAttr {
    fn new(reset: &[libc::c_int]) -> io::Result<SpawnAttr> {
        let check = |r: libc::c_int| match r {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        };
        // SAFETY: init before any other use; the sigset is initialised by sigemptyset.
        unsafe {
            let mut attr = SpawnAttr(std::mem::zeroed());
            check(libc::posix_spawnattr_init(&mut attr.0))?;
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in reset {
                libc::sigaddset(&mut set, *sig);
            }
            // glibc's spawn child sets its two internal signals (32, 33: thread cancellation and
            // setxid) to SIG_IGN unless they are in this set, so the command would start with
            // them ignored where roar was started with them at their default (by a shell).
            // sigaddset refuses them; the set is a bit mask (bit N-1 for signal N), which the
            // child reads as such.
            let ignored = STARTED_IGNORING_GLIBC_OWN.load(Ordering::Relaxed);
            let words = std::ptr::addr_of_mut!(set).cast::<libc::c_ulong>();
            for (bit, sig) in [(1, 32), (2, 33)] {
                if ignored & bit == 0 {
                    *words |= 1 << (sig - 1);
                }
            }
            check(libc::posix_spawnattr_setsigdefault(&mut attr.0, &set))?;
            check(libc::posix_spawnattr_setflags(
                &mut attr.0,
                libc::POSIX_SPAWN_SETSIGDEF as libc::c_short,
            ))?;
            Ok(attr)
        }
    }
}

impl Drop for SpawnAttr {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

/// posix_spawn file actions: close the fds that were closed when roar started.
struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn closing(fds: &[libc::c_int]) -> io::Result<FileActions> {
        let check = |r: libc::c_int| match r {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        };
        // SAFETY: init before any other use.
        unsafe {
            let mut actions = FileActions(std::mem::zeroed());
            check(libc::posix_spawn_file_actions_init(&mut actions.0))?;
            for fd in fds {
                check(libc::posix_spawn_file_actions_addclose(&mut actions.0, *fd))?;
            }
            Ok(actions)
        }
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `closing`, destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// posix_spawn of the file at `path`; one the kernel will not exec is run by /bin/sh, as execvp
/// does.
fn spawn_file(
    path: &[u8],
    args: &[CString],
    envp: &[CString],
    attr: &SpawnAttr,
    actions: &FileActions,
) -> io::Result<i32> {
    let path = CString::new(path).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let envp = pointers(envp);
    let spawn = |file: &CString, argv: &[CString]| {
        let mut pid = 0;
        let argv = pointers(argv);
        // SAFETY: every pointer array is null-terminated and outlives the call; attr and
        // actions are initialised.
        let r = unsafe {
            libc::posix_spawn(
                &mut pid,
                file.as_ptr(),
                &actions.0,
                &attr.0,
                argv.as_ptr(),
                envp.as_ptr(),
            )
        };
        match r {
            0 => Ok(pid),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    };
    match spawn(&path, args) {
        Err(e) if e.raw_os_error() == Some(libc::ENOEXEC) => {
            let sh = CString::from(c"/bin/sh");
            let argv: Vec<CString> = [sh.clone(), path]
                .into_iter()
                .chain(args.iter().skip(1).cloned())
                .collect();
            spawn(&sh, &argv)
        }
        other => other,
    }
}

/// Makes `cmd` start as a resident process nobody waits for (the eBPF helper, the store's
/// recorder): the child forks once more and exits, so the process that execs is a grandchild in a
/// session of its own, adopted by init (or the nearest subreaper: call this before
/// [`become_subreaper`]). `cmd.spawn()` then returns the middle process, which has exited or is
/// about to: wait for it.
pub fn detached(cmd: &mut Command) -> &mut Command {
    // SAFETY: fork, setsid and _exit are async-signal-safe; nothing else runs before exec.
    unsafe {
        cmd.pre_exec(|| {
            match libc::fork() {
                -1 => return Err(io::Error::last_os_error()),
                0 => {}
                _ => libc::_exit(0),
            }
            libc::setsid();
            Ok(())
        })
    }
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

/// Waits for a child with a timeout: a pidfd (Linux 5.3+) polled for its end.
pub(crate) struct Waiter {
    pid: i32,
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl Waiter {
    pub(crate) fn new(pid: i32) -> Waiter {
        // SAFETY: pidfd_open with a pid and no flags; a negative result is an error.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        // SAFETY: a new descriptor, owned from here.
        let pidfd = (fd >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
        Waiter { pid, pidfd }
    }

    /// The child's status if it ends within `within` (then reaped), else None. Without a pidfd
    /// the end cannot be waited for with a timeout: None at once, after a non-blocking check.
    pub(crate) fn within(&self, within: std::time::Duration) -> io::Result<Option<Status>> {
        use std::os::fd::AsRawFd;
        let Some(pidfd) = &self.pidfd else {
            return self.now();
        };
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // Rounded up: poll's unit is the millisecond.
            let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: one valid pollfd.
            match unsafe { libc::poll(&mut pfd, 1, ms) } {
                0 => return Ok(None),
                n if n > 0 => return wait_for(self.pid).map(Some),
                _ => {
                    let err = io::Error::last_os_error();
                    if err.raw_os_error() != Some(libc::EINTR) {
                        return Err(err);
                    }
                }
            }
        }
    }

    /// The child's status if it has ended (then reaped), else None; never blocks.
    pub(crate) fn now(&self) -> io::Result<Option<Status>> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid with a valid out-pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid {
                return Ok(Some(Status::from_wait(status)));
            }
            if r == 0 {
                return Ok(None);
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }

    /// Whether [`Waiter::within`] can wait (a pidfd), rather than only look.
    pub(crate) fn can_wait(&self) -> bool {
        self.pidfd.is_some()
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
