//! What a stopped tracee's syscall is: its arguments read at entry (paths resolved against the
//! tracee's cwd or dirfd) and, with its result at exit, the event it makes.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use roar_store::{now_ns, FileStat};

use crate::event::{join_normalize, Event};

use super::filter::*;

const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

/// A syscall seen at entry, waiting for its result.
pub(super) enum Pending {
    Open {
        path: PathBuf,
        flags: i32,
    },
    One {
        kind: OneKind,
        path: PathBuf,
    },
    Two {
        kind: TwoKind,
        from: PathBuf,
        to: PathBuf,
    },
    /// io_uring_setup: if it succeeds, the process's files may reach no tracer.
    Ring,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TwoKind {
    Rename,
    Link,
    Exchange,
}

#[derive(Clone, Copy)]
pub(super) enum OneKind {
    Symlink,
    Unlink,
    Rmdir,
    Mkdir,
    Truncate,
}

fn read_string(pid: i32, addr: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    let mut at = addr;
    while out.len() < 4096 && at != 0 {
        // Never cross a page boundary in one read: the next page may be unmapped.
        let room = (4096 - (at % 4096)) as usize;
        let want = room.min(buf.len());
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: want,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: want,
        };
        // SAFETY: both iovecs describe valid buffers of `want` bytes (remote in the tracee).
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        let got = &buf[..n as usize];
        if let Some(end) = got.iter().position(|b| *b == 0) {
            out.extend_from_slice(&got[..end]);
            return out;
        }
        out.extend_from_slice(got);
        at += n as u64;
    }
    out
}

fn read_u64(pid: i32, addr: u64) -> Option<u64> {
    let mut v = 0u64;
    let local = libc::iovec {
        iov_base: std::ptr::addr_of_mut!(v).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: as in read_string.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    (n == 8).then_some(v)
}

fn proc_link(pid: i32, what: &str) -> Vec<u8> {
    std::fs::read_link(format!("/proc/{pid}/{what}"))
        .map(|p| p.into_os_string().into_vec())
        .unwrap_or_default()
}

/// The absolute path a (dirfd, path) pair of the tracee names.
fn resolve(pid: i32, dirfd: i64, addr: u64) -> PathBuf {
    let path = read_string(pid, addr);
    let base = if path.first() == Some(&b'/') {
        Vec::new()
    } else if dirfd == AT_FDCWD || dirfd as i32 == libc::AT_FDCWD {
        proc_link(pid, "cwd")
    } else {
        proc_link(pid, &format!("fd/{}", dirfd as i32))
    };
    join_normalize(&base, &path)
}

pub(super) fn regs(pid: i32) -> io::Result<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it.
    unsafe {
        let mut r: libc::user_regs_struct = std::mem::zeroed();
        if libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut r) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r)
    }
}

/// An open about to run (the tracee is stopped at its entry), with the flags it is reported
/// with: an `O_CREAT` open without `O_EXCL` is looked at first, so the report says whether it made
/// the file — without `O_CREAT` when the path is there (the open cannot make it), with `O_EXCL`
/// when it is not (it makes it, or fails). The shim and eBPF say the same; the engine reads them
/// as any open with those flags, and a file there before the job is never taken for one the job
/// made, whatever its ctime.
fn opening(path: PathBuf, flags: i32) -> Pending {
    let creates = flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT;
    let flags = if !creates || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        flags
    } else {
        let there = if flags & libc::O_NOFOLLOW != 0 {
            std::fs::symlink_metadata(&path)
        } else {
            std::fs::metadata(&path)
        };
        match there {
            Ok(_) => flags & !libc::O_CREAT,
            Err(e) if e.kind() == io::ErrorKind::NotFound => flags | libc::O_EXCL,
            Err(_) => flags,
        }
    };
    Pending::Open { path, flags }
}

pub(super) fn on_entry(pid: i32, r: &libc::user_regs_struct) -> Option<Pending> {
    let (a0, a1, a2, a3, a4) = (r.rdi, r.rsi, r.rdx, r.r10, r.r8);
    let one = |kind, dirfd: i64, addr| Pending::One {
        kind,
        path: resolve(pid, dirfd, addr),
    };
    Some(match r.orig_rax {
        SYS_OPEN => opening(resolve(pid, AT_FDCWD, a0), a1 as i32),
        SYS_OPENAT => opening(resolve(pid, a0 as i64, a1), a2 as i32),
        SYS_OPENAT2 => opening(
            resolve(pid, a0 as i64, a1),
            read_u64(pid, a2).unwrap_or(0) as i32,
        ),
        SYS_CREAT => opening(
            resolve(pid, AT_FDCWD, a0),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        ),
        SYS_RENAME | SYS_LINK => Pending::Two {
            kind: if r.orig_rax == SYS_RENAME {
                TwoKind::Rename
            } else {
                TwoKind::Link
            },
            from: resolve(pid, AT_FDCWD, a0),
            to: resolve(pid, AT_FDCWD, a1),
        },
        SYS_RENAMEAT | SYS_RENAMEAT2 | SYS_LINKAT => Pending::Two {
            kind: match r.orig_rax {
                SYS_LINKAT => TwoKind::Link,
                SYS_RENAMEAT2 if a4 & libc::RENAME_EXCHANGE as u64 != 0 => TwoKind::Exchange,
                _ => TwoKind::Rename,
            },
            from: resolve(pid, a0 as i64, a1),
            to: resolve(pid, a2 as i64, a3),
        },
        SYS_UNLINK => one(OneKind::Unlink, AT_FDCWD, a0),
        // symlink(target, linkpath), symlinkat(target, newdirfd, linkpath).
        SYS_SYMLINK => one(OneKind::Symlink, AT_FDCWD, a1),
        SYS_SYMLINKAT => one(OneKind::Symlink, a1 as i64, a2),
        SYS_UNLINKAT => {
            let kind = if a2 as i32 & libc::AT_REMOVEDIR != 0 {
                OneKind::Rmdir
            } else {
                OneKind::Unlink
            };
            one(kind, a0 as i64, a1)
        }
        SYS_RMDIR => one(OneKind::Rmdir, AT_FDCWD, a0),
        SYS_MKDIR => one(OneKind::Mkdir, AT_FDCWD, a0),
        SYS_MKDIRAT => one(OneKind::Mkdir, a0 as i64, a1),
        SYS_TRUNCATE => one(OneKind::Truncate, AT_FDCWD, a0),
        SYS_FTRUNCATE => {
            // A file with no name left (unlinked while open) is truncated at no path.
            let fd = format!("/proc/{pid}/fd/{}", a0 as i32);
            if std::fs::metadata(&fd).is_ok_and(|m| std::os::unix::fs::MetadataExt::nlink(&m) == 0)
            {
                return None;
            }
            Pending::One {
                kind: OneKind::Truncate,
                path: PathBuf::from(OsString::from_vec(proc_link(
                    pid,
                    &format!("fd/{}", a0 as i32),
                ))),
            }
        }
        SYS_IO_URING_SETUP => Pending::Ring,
        _ => return None,
    })
}

pub(super) fn on_exit(pid: i32, pending: Pending, result: i64) -> Option<Event> {
    if result < 0 {
        return None;
    }
    let ts_ns = now_ns();
    Some(match pending {
        Pending::Ring => Event::Untraced {
            pid,
            path: PathBuf::from(OsString::from_vec(proc_link(pid, "exe"))),
            why: crate::IO_URING,
            ts_ns,
        },
        Pending::Open { path, flags } => {
            let meta = std::fs::metadata(format!("/proc/{pid}/fd/{result}")).ok()?;
            if !meta.is_file() {
                return None;
            }
            Event::Open {
                pid,
                path,
                flags,
                stat: Some(FileStat::from_metadata(&meta)),
                ts_ns,
            }
        }
        Pending::Two {
            kind: TwoKind::Exchange,
            from,
            to,
        } => Event::Exchange {
            pid,
            a: from,
            b: to,
            ts_ns,
        },
        Pending::Two {
            kind: TwoKind::Rename,
            from,
            to,
        } => Event::Rename {
            pid,
            from,
            to,
            ts_ns,
        },
        Pending::Two {
            kind: TwoKind::Link,
            from,
            to,
        } => Event::Link {
            pid,
            from,
            to,
            ts_ns,
        },
        Pending::One { kind, path } => match kind {
            OneKind::Unlink => Event::Unlink { pid, path, ts_ns },
            OneKind::Symlink => Event::Symlink { pid, path, ts_ns },
            OneKind::Rmdir => Event::Rmdir { pid, path, ts_ns },
            OneKind::Mkdir => Event::Mkdir { pid, path, ts_ns },
            OneKind::Truncate => Event::Truncate { pid, path, ts_ns },
        },
    })
}
