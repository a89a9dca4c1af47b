//! The ptrace backend: a seccomp-bpf filter makes only file-namespace syscalls stop, so the traced
//! program runs at full speed between them; forks, clones and execs are followed with ptrace
//! options. Works for static and setuid programs, which the preload shim cannot enter.
//!
//! Each filtered syscall costs two stops: at entry (seccomp) its path arguments are read and
//! resolved against the tracee's cwd or dirfd; at exit its result decides whether it is reported.
//! A read-only open that repeats one the same program already made of the same file takes only
//! the first ([`reopens`]).

mod reopens;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use roar_store::{now_ns, FileStat};

use crate::event::{join_normalize, Event};
use crate::launch::{self, Status};
use crate::{Tap, TraceError, Traced};
use reopens::Reopens;

// x86_64 syscall numbers of everything that names or changes a file.
const SYS_OPEN: u64 = 2;
const SYS_TRUNCATE: u64 = 76;
const SYS_FTRUNCATE: u64 = 77;
const SYS_RENAME: u64 = 82;
const SYS_MKDIR: u64 = 83;
const SYS_RMDIR: u64 = 84;
const SYS_CREAT: u64 = 85;
const SYS_LINK: u64 = 86;
const SYS_UNLINK: u64 = 87;
const SYS_SYMLINK: u64 = 88;
const SYS_OPENAT: u64 = 257;
const SYS_MKDIRAT: u64 = 258;
const SYS_UNLINKAT: u64 = 263;
const SYS_RENAMEAT: u64 = 264;
const SYS_LINKAT: u64 = 265;
const SYS_SYMLINKAT: u64 = 266;
const SYS_RENAMEAT2: u64 = 316;
const SYS_OPENAT2: u64 = 437;
const TRACED_SYSCALLS: [u64; 18] = [
    SYS_OPEN,
    SYS_TRUNCATE,
    SYS_FTRUNCATE,
    SYS_RENAME,
    SYS_MKDIR,
    SYS_RMDIR,
    SYS_CREAT,
    SYS_LINK,
    SYS_UNLINK,
    SYS_OPENAT,
    SYS_MKDIRAT,
    SYS_UNLINKAT,
    SYS_RENAMEAT,
    SYS_LINKAT,
    SYS_RENAMEAT2,
    SYS_OPENAT2,
    SYS_SYMLINK,
    SYS_SYMLINKAT,
];

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_TRACE: u32 = 0x7ff0_0000;
const AT_FDCWD: i64 = libc::AT_FDCWD as i64;

fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `RET_TRACE` for the syscalls above (x86_64 ABI only), `RET_ALLOW` for everything else, and for
/// `open`/`openat` of directories (`O_DIRECTORY`): `find` and `ls -R` open thousands of them and
/// they are never artifacts, so they do not stop the tracee at all.
fn filter() -> Vec<libc::sock_filter> {
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let jset = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    // seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low 32 bits first on x86_64).
    let arg = |i: u32| 16 + 8 * i;
    let others: Vec<u64> = TRACED_SYSCALLS
        .iter()
        .copied()
        .filter(|nr| *nr != SYS_OPEN && *nr != SYS_OPENAT)
        .collect();
    let m = others.len();
    // Instruction indexes of the jump targets.
    let allow = 5 + m;
    let open_blk = allow + 1;
    let openat_blk = open_blk + 2;
    let allow_dir = openat_blk + 2;
    let trace = allow_dir + 1;
    let off = |from: usize, to: usize| (to - from - 1) as u8;
    let mut prog = vec![
        bpf(ld, 0, 0, 4),
        bpf(jeq, 0, off(1, allow), AUDIT_ARCH_X86_64),
        bpf(ld, 0, 0, 0),
        bpf(jeq, off(3, open_blk), 0, SYS_OPEN as u32),
        bpf(jeq, off(4, openat_blk), 0, SYS_OPENAT as u32),
    ];
    for (i, nr) in others.iter().enumerate() {
        prog.push(bpf(jeq, off(5 + i, trace), 0, *nr as u32));
    }
    prog.push(bpf(ret, 0, 0, SECCOMP_RET_ALLOW));
    prog.push(bpf(ld, 0, 0, arg(1)));
    prog.push(bpf(
        jset,
        off(open_blk + 1, allow_dir),
        off(open_blk + 1, trace),
        libc::O_DIRECTORY as u32,
    ));
    prog.push(bpf(ld, 0, 0, arg(2)));
    prog.push(bpf(
        jset,
        off(openat_blk + 1, allow_dir),
        off(openat_blk + 1, trace),
        libc::O_DIRECTORY as u32,
    ));
    prog.push(bpf(ret, 0, 0, SECCOMP_RET_ALLOW));
    prog.push(bpf(ret, 0, 0, SECCOMP_RET_TRACE));
    debug_assert_eq!(prog.len(), trace + 1);
    prog
}

/// A syscall seen at entry, waiting for its result.
enum Pending {
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
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TwoKind {
    Rename,
    Link,
    Exchange,
}

#[derive(Clone, Copy)]
enum OneKind {
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

fn regs(pid: i32) -> io::Result<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it.
    unsafe {
        let mut r: libc::user_regs_struct = std::mem::zeroed();
        if libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut r) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r)
    }
}

fn on_entry(pid: i32, r: &libc::user_regs_struct) -> Option<Pending> {
    let (a0, a1, a2, a3, a4) = (r.rdi, r.rsi, r.rdx, r.r10, r.r8);
    let one = |kind, dirfd: i64, addr| Pending::One {
        kind,
        path: resolve(pid, dirfd, addr),
    };
    Some(match r.orig_rax {
        SYS_OPEN => Pending::Open {
            path: resolve(pid, AT_FDCWD, a0),
            flags: a1 as i32,
        },
        SYS_OPENAT => Pending::Open {
            path: resolve(pid, a0 as i64, a1),
            flags: a2 as i32,
        },
        SYS_OPENAT2 => Pending::Open {
            path: resolve(pid, a0 as i64, a1),
            flags: read_u64(pid, a2).unwrap_or(0) as i32,
        },
        SYS_CREAT => Pending::Open {
            path: resolve(pid, AT_FDCWD, a0),
            flags: libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        },
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
        SYS_FTRUNCATE => Pending::One {
            kind: OneKind::Truncate,
            path: PathBuf::from(OsString::from_vec(proc_link(
                pid,
                &format!("fd/{}", a0 as i32),
            ))),
        },
        _ => return None,
    })
}

fn on_exit(pid: i32, pending: Pending, result: i64) -> Option<Event> {
    if result < 0 {
        return None;
    }
    let ts_ns = now_ns();
    Some(match pending {
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

pub fn run(argv: &[OsString], env: &crate::EnvChanges, tap: &Tap) -> Result<Traced, TraceError> {
    let guard = launch::SignalGuard::install();
    launch::become_subreaper();
    let mut cmd = launch::command(argv, env, &guard);
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
    let ctime_floor_ns = crate::ctime_floor_ns();
    let started_ns = now_ns();
    // exec happens before the first stop, so spawn returns (its error pipe closes on exec).
    let child = cmd.spawn().map_err(|e| launch::spawn_error(&argv[0], e))?;
    let root = child.id() as i32;
    guard.set_child(root);
    drop(child);

    let first = crate::from_proc::exec_event(root);
    tap(&first);
    let mut events = vec![first];
    let mut pending: HashMap<i32, Pending> = HashMap::new();
    let mut reopens = Reopens::default();
    // Processes (not threads) whose exit is reported, and every tid whose first stop was seen.
    let mut known: HashSet<i32> = HashSet::from([root]);
    let mut seen: HashSet<i32> = HashSet::from([root]);
    let mut root_status = None;
    let mut options_set = false;
    let mut malformed = 0;
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
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
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            pending.remove(&pid);
            reopens.exited(pid);
            if known.remove(&pid) {
                let ev = Event::Exit {
                    pid,
                    ts_ns: now_ns(),
                };
                tap(&ev);
                events.push(ev);
            }
            if pid == root {
                root_status = Some(Status::from_wait(status));
            }
            continue;
        }
        if !libc::WIFSTOPPED(status) {
            continue;
        }
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if pid == root && !options_set {
            // The SIGTRAP of the first exec under PTRACE_TRACEME: now the options can be set,
            // and the new program's credentials are in place.
            options_set = true;
            reopens.exec(root);
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
            continue;
        }
        match (sig, event) {
            (libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP) => {
                match regs(pid).ok().and_then(|r| on_entry(pid, &r)) {
                    Some(Pending::Open { path, flags }) => {
                        match reopens.repeat(pid, &path, flags) {
                            Some(stat) => {
                                // Recorded now: its result would add nothing (see reopens).
                                let ev = Event::Open {
                                    pid,
                                    path,
                                    flags,
                                    stat: Some(stat),
                                    ts_ns: now_ns(),
                                };
                                tap(&ev);
                                events.push(ev);
                                cont(libc::PTRACE_CONT, pid, 0);
                            }
                            None => {
                                pending.insert(pid, Pending::Open { path, flags });
                                cont(libc::PTRACE_SYSCALL, pid, 0);
                            }
                        }
                    }
                    Some(p) => {
                        pending.insert(pid, p);
                        cont(libc::PTRACE_SYSCALL, pid, 0);
                    }
                    None => cont(libc::PTRACE_CONT, pid, 0),
                }
            }
            (
                libc::SIGTRAP,
                libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE,
            ) => {
                let mut new: libc::c_ulong = 0;
                // SAFETY: GETEVENTMSG writes one c_ulong.
                unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, pid, 0, &mut new) };
                let new = new as i32;
                if new > 0 {
                    reopens.forked(pid, new);
                }
                if new > 0 && !is_thread(new) {
                    known.insert(new);
                    let ev = Event::Fork {
                        pid: new,
                        ppid: pid,
                        ts_ns: now_ns(),
                    };
                    tap(&ev);
                    events.push(ev);
                }
                cont(libc::PTRACE_CONT, pid, 0);
            }
            (libc::SIGTRAP, libc::PTRACE_EVENT_EXEC) => {
                known.insert(pid);
                let ev = crate::from_proc::exec_event(pid);
                reopens.exec(pid);
                tap(&ev);
                events.push(ev);
                cont(libc::PTRACE_CONT, pid, 0);
            }
            (s, 0) if s == libc::SIGTRAP | 0x80 => {
                match (pending.remove(&pid), regs(pid)) {
                    (Some(p), Ok(r)) => {
                        if let Some(ev) = on_exit(pid, p, r.rax as i64) {
                            reopens.saw(&ev);
                            tap(&ev);
                            events.push(ev);
                        }
                    }
                    (Some(_), Err(_)) => malformed += 1,
                    _ => {}
                }
                cont(libc::PTRACE_CONT, pid, 0);
            }
            (libc::SIGSTOP, 0) if !seen.contains(&pid) => {
                // The initial stop of an auto-attached child or thread (it may beat the fork event).
                seen.insert(pid);
                cont(libc::PTRACE_CONT, pid, 0);
            }
            (s, 0) => {
                // A signal for the tracee: deliver it, unless this is a group-stop report.
                // SAFETY: siginfo_t is plain data; GETSIGINFO fails (EINVAL) for group-stops.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                let real = unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, pid, 0, &mut info) } == 0;
                cont(libc::PTRACE_CONT, pid, if real { s } else { 0 });
            }
            _ => cont(libc::PTRACE_CONT, pid, 0),
        }
    }
    let ended_ns = now_ns();
    drop(guard);
    Ok(Traced {
        events,
        status: root_status.unwrap_or(Status::Exited(0)),
        started_ns,
        ctime_floor_ns,
        ended_ns,
        malformed,
        cut_off: 0,
        lost: 0,
        forged: 0,
        untraced: Vec::new(),
        cut_short: None,
    })
}

#[cfg(test)]
mod tests {
    /// Runs a classic-BPF seccomp program (the instructions `filter` uses) on one syscall.
    fn eval(prog: &[libc::sock_filter], arch: u32, nr: u64, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = prog[pc];
            let class = ins.code as u32 & 0x07;
            match class {
                c if c == libc::BPF_LD => {
                    let k = ins.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                c if c == libc::BPF_JMP => {
                    let taken = if ins.code as u32 & 0xf0 == libc::BPF_JSET {
                        acc & ins.k != 0
                    } else {
                        acc == ins.k
                    };
                    pc += 1 + if taken { ins.jt } else { ins.jf } as usize;
                }
                c if c == libc::BPF_RET => return ins.k,
                other => panic!("unexpected instruction class {other}"),
            }
        }
    }

    #[test]
    fn the_filter_traces_file_syscalls_but_not_directory_opens() {
        use super::*;
        let prog = filter();
        let x86 = AUDIT_ARCH_X86_64;
        let dir = libc::O_DIRECTORY as u64;
        let e = [0u64; 6];
        assert_eq!(
            eval(
                &prog,
                x86,
                SYS_OPENAT,
                [0, 0, libc::O_RDONLY as u64, 0, 0, 0]
            ),
            SECCOMP_RET_TRACE
        );
        assert_eq!(
            eval(&prog, x86, SYS_OPENAT, [0, 0, dir, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            eval(&prog, x86, SYS_OPEN, [0, libc::O_WRONLY as u64, 0, 0, 0, 0]),
            SECCOMP_RET_TRACE
        );
        assert_eq!(
            eval(&prog, x86, SYS_OPEN, [0, dir, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        for nr in TRACED_SYSCALLS
            .iter()
            .filter(|n| **n != SYS_OPEN && **n != SYS_OPENAT)
        {
            assert_eq!(eval(&prog, x86, *nr, e), SECCOMP_RET_TRACE, "syscall {nr}");
        }
        for nr in [0u64, 1, 3, 59, 60, 231] {
            assert_eq!(eval(&prog, x86, nr, e), SECCOMP_RET_ALLOW, "syscall {nr}");
        }
        assert_eq!(
            eval(&prog, 0x4000_0003, SYS_OPENAT, e),
            SECCOMP_RET_ALLOW,
            "other ABIs pass"
        );
    }
}
