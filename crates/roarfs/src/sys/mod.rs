//! The few syscalls roarfs makes relative to directory fds, as safe functions returning
//! `io::Result`. Every backing file is reached from an `O_PATH` fd, never by a path through the
//! mount (which would loop back into this filesystem).
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

mod events;
mod handle;
mod procs;

pub use events::{Exit, ExitEvents, Exits, Fork, Poke};
pub use handle::FileHandle;
pub use procs::{
    block_signals, cwds_under, dead_stdin_pipe, processes_inside, terminate, wait_signal,
    writers_under, OpenWriter,
};

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

/// Asks the kernel to drop the page cache of `len` bytes of `fd` at `offset` (clean pages;
/// dirty ones are written back first, in the background).
pub fn drop_cached(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<()> {
    // SAFETY: plain integer arguments on a descriptor we hold.
    let r = unsafe {
        libc::posix_fadvise(
            fd.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    // posix_fadvise returns the error number instead of setting errno.
    match r {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
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

/// Unmounts `path`; EBUSY while files under it are open.
pub fn umount(path: &std::path::Path) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::umount2(p.as_ptr(), 0) })?;
    Ok(())
}

/// Detaches a mount lazily: it leaves the tree now and goes once nothing uses it (a dead FUSE
/// mount whose daemon is gone, or a busy one `--force` unmounts).
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

/// Points fd 1 at whatever fd 2 is (a daemon's log), closing the pipe its parent reads.
pub fn dup_stderr_to_stdout() {
    // SAFETY: dup2 on two standard descriptors; fd 1 is replaced atomically.
    unsafe { libc::dup2(2, 1) };
}

/// The unit of process start times in /proc/PID/stat.
fn clock_ns(clock: libc::clockid_t) -> i64 {
    // SAFETY: timespec is plain integers: all zeroes is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes one timespec we own; both clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_MONOTONIC now, ns: the clock of the proc connector's event stamps.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

/// How far CLOCK_BOOTTIME (process start times in /proc) is ahead of CLOCK_MONOTONIC: the time
/// the machine spent suspended.
pub fn boottime_minus_monotonic_ns() -> i64 {
    let boot = clock_ns(libc::CLOCK_BOOTTIME);
    boot - clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn clock_ticks_per_second() -> i64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as i64
}

/// Raises the soft limit on open files to the hard limit (a daemon serving many open files).
pub fn raise_fd_limit() -> io::Result<u64> {
    // SAFETY: getrlimit/setrlimit write/read one rlimit struct we own.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        check(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim))?;
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            check(libc::setrlimit(libc::RLIMIT_NOFILE, &lim))?;
        }
        Ok(lim.rlim_cur)
    }
}

/// The number of descriptors this process has open.
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The identity a request comes from: the calling thread and its fs ids.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// The caller's umask, to apply (0 when the kernel has applied it already).
    pub umask: u32,
}

thread_local! {
    /// Whether this thread has its own umask (unshare(CLONE_FS) done).
    static OWN_UMASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The supplementary groups of process (or thread) `pid`, from /proc.
fn groups_of(pid: u32) -> Vec<libc::gid_t> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

fn daemon_groups() -> &'static [libc::gid_t] {
    static GROUPS: std::sync::OnceLock<Vec<libc::gid_t>> = std::sync::OnceLock::new();
    GROUPS.get_or_init(|| groups_of(std::process::id()))
}

fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the raw syscall (not glibc's wrapper, which changes every thread) sets this
    // thread's groups from a live slice of `len` gids.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` (a creating syscall) with this thread's umask, fsuid, fsgid and supplementary groups
/// set to the caller's, so the backing filesystem creates exactly what it would for the caller:
/// owner and group (a setgid directory's group included), mode with the caller's umask or the
/// directory's default ACL, setuid/setgid bits a non-root creator may keep. The kernel has
/// already checked the caller's permissions (default_permissions). Only a root daemon switches
/// ids; every thread gets its own umask once (unshare(CLONE_FS), as virtiofsd does).
pub fn as_caller<T>(caller: Caller, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    if !OWN_UMASK.get() {
        // SAFETY: unshare(CLONE_FS) only gives this thread a private cwd/root/umask.
        check(unsafe { libc::unshare(libc::CLONE_FS) })?;
        OWN_UMASK.set(true);
    }
    // SAFETY: umask/geteuid have no preconditions.
    let old_umask = unsafe { libc::umask(caller.umask as libc::mode_t) };
    // SAFETY: as above.
    let root = unsafe { libc::geteuid() } == 0;
    let switch = root && (caller.uid != 0 || caller.gid != 0);
    if switch {
        if caller.uid != 0 {
            set_thread_groups(&groups_of(caller.pid))?;
        }
        // SAFETY: setfsgid/setfsuid change only this thread's filesystem ids (raw syscalls).
        unsafe {
            libc::syscall(libc::SYS_setfsgid, caller.gid);
            libc::syscall(libc::SYS_setfsuid, caller.uid);
        }
    }
    let r = f();
    if switch {
        // SAFETY: back to the daemon's own ids; fsuid 0 gives back the fs capabilities.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, 0);
            libc::syscall(libc::SYS_setfsgid, libc::getegid());
        }
        if caller.uid != 0 {
            set_thread_groups(daemon_groups())?;
        }
    }
    // SAFETY: as above.
    unsafe { libc::umask(old_umask) };
    r
}

/// The device (`st_dev`) of the mount on top at `dir` in this mount namespace, from
/// /proc/self/mountinfo: of the entries for one mount point, the last is the one on top.
pub fn top_mount_dev(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let want = dir.as_os_str().as_bytes();
    info.split(|b| *b == b'\n').rev().find_map(|line| {
        let f: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        if roar_archive::mounted::unescape(f.get(4)?) != want {
            return None;
        }
        let (major, minor) = std::str::from_utf8(f.get(2)?).ok()?.split_once(':')?;
        Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
    })
}

/// A stat(2) result as the store's identity of a file's content.
pub fn file_stat(st: &libc::stat) -> roar_store::FileStat {
    roar_store::FileStat {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
    }
}
