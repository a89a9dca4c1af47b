//! A process's current program read from /proc: what ptrace reports at an exec stop, and what the
//! mount reads for a process it sees (it is not stopped there: a process that already exited
//! reads as an empty program). The mount tells the streams apart its own way ([`exec_with`]):
//! a stat of a file on the mount would be a request to itself.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use roar_store::now_ns;

use crate::event::Event;

fn link(pid: i32, what: &str) -> Vec<u8> {
    std::fs::read_link(format!("/proc/{pid}/{what}"))
        .map(|p| p.into_os_string().into_vec())
        .unwrap_or_default()
}

/// One standard stream of a process, as step attribution tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Closed, a terminal, a device, or a pipe nobody can write to.
    Other,
    /// A regular file, by (dev, ino).
    File(u64, u64),
    /// A pipe, FIFO or socket, by (dev, ino).
    Pipe(u64, u64),
}

/// `pid`'s program as an exec event: exe, argv, cwd, parent, and its standard streams.
pub fn exec_event(pid: i32) -> Event {
    exec_with(pid, |fd| {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        match std::fs::metadata(format!("/proc/{pid}/fd/{fd}")) {
            Ok(m) if m.is_file() => Stream::File(m.dev(), m.ino()),
            // A stdin pipe nobody can write to carries nothing (GNU make's parallel recipes).
            Ok(m) if fd == 0 && m.file_type().is_fifo() && dead_pipe(pid) => Stream::Other,
            Ok(m) if m.file_type().is_fifo() || m.file_type().is_socket() => {
                Stream::Pipe(m.dev(), m.ino())
            }
            _ => Stream::Other,
        }
    })
}

/// [`exec_event`] with the standard streams (by descriptor) as `stream` tells them.
pub fn exec_with(pid: i32, stream: impl Fn(i32) -> Stream) -> Event {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = cmdline.strip_suffix(b"\0").unwrap_or(&cmdline);
    let ppid = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PPid:").and_then(|v| v.trim().parse().ok()))
        })
        .unwrap_or(0);
    let streams = [0, 1, 2].map(stream);
    let of = |pipe: bool| {
        streams.map(|s| match s {
            Stream::File(dev, ino) if !pipe => Some((dev, ino)),
            Stream::Pipe(dev, ino) if pipe => Some((dev, ino)),
            _ => None,
        })
    };
    Event::Exec {
        pid,
        ppid,
        exe: PathBuf::from(OsString::from_vec(link(pid, "exe"))),
        argv: roar_store::argv_from_blob(cmdline),
        cwd: PathBuf::from(OsString::from_vec(link(pid, "cwd"))),
        stdio: of(false),
        pipes: of(true),
        ts_ns: now_ns(),
    }
}

/// Whether `pid`'s stdin is a pipe with no writer and nothing left to read (looked at through a
/// reader of our own, opened by /proc; it takes nothing from the pipe).
fn dead_pipe(pid: i32) -> bool {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/0"))
    else {
        return false;
    };
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLHUP != 0 && p.revents & libc::POLLIN == 0
}

/// Why this process should not start a resident process (the eBPF helper, the recorder): it runs
/// inside another `roar`, which would wait for it as for any process its command leaves behind.
pub fn inside_roar() -> Option<String> {
    let me = std::fs::read_link("/proc/self/exe").ok()?;
    // SAFETY: getppid has no preconditions.
    let mut pid = unsafe { libc::getppid() };
    for _ in 0..64 {
        if pid <= 1 {
            return None;
        }
        use procfs::FromRead;
        let stat = procfs::process::Stat::from_file(format!("/proc/{pid}/stat")).ok()?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        if stat.comm == "roar" || exe.as_deref() == Some(me.as_path()) {
            return Some(format!("process {pid} is a roar"));
        }
        pid = stat.ppid;
    }
    None
}
