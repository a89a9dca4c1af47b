//! The few syscalls roarfs makes relative to directory fds, as safe functions returning
//! `io::Result`. Every backing file is reached from an `O_PATH` fd, never by a path through the
//! mount (which would loop back into this filesystem).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `/proc/self/fd/N`: reopens or names an `O_PATH` fd with the kernel's own resolution.
pub fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL")
}

pub fn open_path(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated; the returned fd is new and owned by us.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `fd` was just returned by openat and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the file an `O_PATH` fd names with real access `flags` (O_CREAT/O_EXCL dropped).
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<File> {
    let path = proc_path(fd);
    let flags = (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW)) | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated; the fd is new and owned by the File.
    let fd = check(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: as above.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Creates `name` in `dir` (O_CREAT with the caller's flags) and returns it open.
pub fn create_at(dir: BorrowedFd<'_>, name: &OsStr, flags: i32, mode: u32) -> io::Result<File> {
    let name = cstr(name)?;
    let flags = flags | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: `name` is NUL-terminated; the returned fd is owned by the File.
    let fd = check(unsafe {
        libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint)
    })?;
    // SAFETY: as above.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path with AT_EMPTY_PATH stats the fd itself; `st` is writable.
    check(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

pub fn mkdir_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

pub fn mknod_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32, rdev: u32) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated.
    check(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    })?;
    Ok(())
}

pub fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr, flags: i32) -> io::Result<()> {
    let name = cstr(name)?;
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

pub fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &OsStr,
    to_dir: BorrowedFd<'_>,
    to: &OsStr,
    flags: u32,
) -> io::Result<()> {
    let (from, to) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names are NUL-terminated.
    check(unsafe {
        libc::renameat2(
            from_dir.as_raw_fd(),
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
            flags,
        )
    })?;
    Ok(())
}

pub fn link_at(fd: BorrowedFd<'_>, to_dir: BorrowedFd<'_>, to: &OsStr) -> io::Result<()> {
    let to = cstr(to)?;
    let from = proc_path(fd);
    // SAFETY: both paths are NUL-terminated; AT_SYMLINK_FOLLOW resolves the /proc link to the
    // file itself (the documented way to link an O_PATH fd without CAP_DAC_READ_SEARCH).
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })?;
    Ok(())
}

pub fn symlink_at(target: &OsStr, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let (target, name) = (cstr(target)?, cstr(name)?);
    // SAFETY: both are NUL-terminated.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the empty path reads the symlink the O_PATH fd refers to; `buf` is writable.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn chown_fd(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
    // SAFETY: AT_EMPTY_PATH with "" changes the fd's own file; -1 leaves an id unchanged.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            u,
            g,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::chmod(path.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

pub fn truncate_fd(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::truncate(path.as_ptr(), size as libc::off_t) })?;
    Ok(())
}

/// `None` leaves a time as it is; `Some(None)` sets it to now.
pub fn utimens_fd(
    fd: BorrowedFd<'_>,
    atime: Option<Option<libc::timespec>>,
    mtime: Option<Option<libc::timespec>>,
) -> io::Result<()> {
    let conv = |t: Option<Option<libc::timespec>>| match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(None) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(Some(ts)) => ts,
    };
    let times = [conv(atime), conv(mtime)];
    let path = proc_path(fd);
    // SAFETY: NUL-terminated path and a two-element array, as utimensat wants. Symlinks are
    // resolved by /proc to themselves only with AT_SYMLINK_NOFOLLOW.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) })?;
    Ok(())
}

pub fn statvfs_fd(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    let file = reopen(fd, libc::O_RDONLY | libc::O_DIRECTORY)?;
    // SAFETY: zeroed statvfs is valid to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is open; `st` is writable.
    check(unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub enum Xattr<'a> {
    Get(&'a OsStr, &'a mut [u8]),
    List(&'a mut [u8]),
    Set(&'a OsStr, &'a [u8], i32),
    Remove(&'a OsStr),
}

/// xattr calls on the file an `O_PATH` fd names; returns the size for get/list.
pub fn xattr(fd: BorrowedFd<'_>, op: Xattr<'_>) -> io::Result<usize> {
    let path = proc_path(fd);
    // SAFETY: every pointer below is NUL-terminated (names, path) or a live slice of the given
    // length (values, buffers); a zero-length buffer asks for the size.
    let n = unsafe {
        match op {
            Xattr::Get(name, buf) => {
                let name = cstr(name)?;
                libc::getxattr(
                    path.as_ptr(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            }
            Xattr::List(buf) => libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()),
            Xattr::Set(name, value, flags) => {
                let name = cstr(name)?;
                libc::setxattr(
                    path.as_ptr(),
                    name.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    flags,
                ) as isize
            }
            Xattr::Remove(name) => {
                let name = cstr(name)?;
                libc::removexattr(path.as_ptr(), name.as_ptr()) as isize
            }
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

pub fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: `file` is open.
    check(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })?;
    Ok(())
}

pub fn lseek(file: &File, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: `file` is open.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Detaches a mount (used on a dead FUSE mount whose daemon is gone).
pub fn umount_detach(path: &std::path::Path) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) })?;
    Ok(())
}

/// Reads a directory (through a fresh fd of the `O_PATH` one) into (name, ino, d_type) entries.
pub fn read_dir(fd: BorrowedFd<'_>) -> io::Result<Vec<(std::ffi::OsString, u64, u8)>> {
    let file = reopen(fd, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let raw: RawFd = file.as_raw_fd();
    // SAFETY: fdopendir takes ownership of a dup of our fd; closedir below releases it.
    let dup = check(unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `dup` is an open directory fd we own; fdopendir takes it.
    let dir = unsafe { libc::fdopendir(dup) };
    if dir.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: `dir` is a valid DIR*; readdir returns NULL at the end.
        let ent = unsafe { libc::readdir64(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: `ent` points to a dirent64 valid until the next readdir on `dir`.
        let (name, ino, ty) = unsafe {
            let e = &*ent;
            let name = std::ffi::CStr::from_ptr(e.d_name.as_ptr());
            (
                OsStr::from_bytes(name.to_bytes()).to_owned(),
                e.d_ino,
                e.d_type,
            )
        };
        if name == "." || name == ".." {
            continue;
        }
        out.push((name, ino, ty));
    }
    // SAFETY: `dir` is valid and closed exactly once.
    unsafe { libc::closedir(dir) };
    Ok(out)
}

/// The working directories of processes that are inside `dir` (they bypass an in-place mount).
pub fn processes_inside(dir: &std::path::Path) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    let me = std::process::id() as i32;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        if cwd.starts_with(dir) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push((pid, comm.trim().to_owned()));
        }
    }
    out
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

/// Points fd 1 at whatever fd 2 is (a daemon's log), closing the pipe its parent reads.
pub fn dup_stderr_to_stdout() {
    // SAFETY: dup2 on two standard descriptors; fd 1 is replaced atomically.
    unsafe { libc::dup2(2, 1) };
}

/// The unit of process start times in /proc/PID/stat.
pub fn clock_ticks_per_second() -> i64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as i64
}
