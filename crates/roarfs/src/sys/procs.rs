//! Other processes: what they hold open under a directory, where they work, the signals the
//! daemon waits for and sends, and whether a stdin pipe can still bring anything.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A descriptor some process holds open for writing on a file under a directory.
#[derive(Debug, Clone)]
pub struct OpenWriter {
    pub pid: i32,
    pub comm: String,
    pub path: std::path::PathBuf,
}

/// The processes other than `except` and this one, by pid.
fn other_processes(except: i32) -> impl Iterator<Item = i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<i32>().ok())
        .filter(move |&pid| pid != except && pid != me)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The processes (other than `except`) whose working directory is under `dir`: they keep a
/// mount busy without holding any file open.
pub fn cwds_under(dir: &std::path::Path, except: i32) -> Vec<OpenWriter> {
    other_processes(except)
        .filter_map(|pid| {
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
            cwd.starts_with(dir).then(|| OpenWriter {
                pid,
                comm: comm(pid),
                path: cwd,
            })
        })
        .collect()
}

/// The processes (other than `except`) holding files under `dir` open for writing, from
/// /proc/PID/fd and the access mode in /proc/PID/fdinfo (what `fuser -m` looks at).
pub fn writers_under(dir: &std::path::Path, except: i32) -> Vec<OpenWriter> {
    let mut out = Vec::new();
    for pid in other_processes(except) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if !target.starts_with(dir) {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
                .unwrap_or(0);
            if flags & libc::O_ACCMODE != libc::O_RDONLY {
                out.push(OpenWriter {
                    pid,
                    comm: comm(pid),
                    path: target,
                });
            }
        }
    }
    out
}

/// The working directories of processes that are inside `dir` (they bypass an in-place mount).
pub fn processes_inside(dir: &std::path::Path) -> Vec<(i32, String)> {
    cwds_under(dir, -1)
        .into_iter()
        .map(|w| (w.pid, w.comm))
        .collect()
}

/// Blocks `signals` in this thread and every thread it starts afterwards.
pub fn block_signals(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: an all-zero sigset is valid input to sigemptyset, which initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Waits up to `timeout` for one of the blocked signals in `set`.
pub fn wait_signal(set: &libc::sigset_t, timeout: std::time::Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` was initialised by `block_signals`; a null siginfo pointer is allowed.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

/// Sends SIGTERM to `pid`; false if there is no such process.
pub fn terminate(pid: i32) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGTERM) == 0 }
}

/// Whether process `pid`'s stdin is a pipe nobody can write to that holds nothing (GNU make
/// gives every parallel recipe but one such a pipe). Looked at through a duplicate of the
/// process's descriptor (`pidfd_getfd`), never by opening `/proc/PID/fd/0`: between a readlink
/// and an open, a shell can put a file on the mount there, and the daemon opening a file on its
/// own mount waits for a request its busy threads may never serve. A duplicate that turns out
/// not to be a pipe is closed on a thread of its own (closing a file on the mount is a request
/// too).
pub fn dead_stdin_pipe(pid: i32) -> bool {
    // SAFETY: pidfd_open and pidfd_getfd return new descriptors we own or -1; poll gets one
    // valid pollfd and no wait.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return false;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), 0, 0);
        if fd < 0 {
            return false;
        }
        let fd = OwnedFd::from_raw_fd(fd as i32);
        let pipe = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"pipe:"));
        if !pipe {
            let _ = std::thread::Builder::new()
                .name("roarfs-close".into())
                .spawn(move || drop(fd));
            return false;
        }
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let n = libc::poll(&mut p, 1, 0);
        n == 1 && p.revents & libc::POLLHUP != 0 && p.revents & libc::POLLIN == 0
    }
}
