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

/// A kernel file handle (`name_to_handle_at`): names a backing inode without holding it open,
/// so the daemon needs no descriptor per inode it knows. The bytes are opaque and, for one file,
/// always the same (they carry the inode number and its generation, so a reused inode number
/// gives a different handle).
#[derive(Clone, PartialEq, Eq)]
pub struct FileHandle {
    kind: i32,
    bytes: Box<[u8]>,
}

/// `MAX_HANDLE_SZ` in the kernel.
const MAX_HANDLE_SZ: usize = 128;

#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl FileHandle {
    /// The handle of the file `fd` refers to (an `O_PATH` fd is enough), and its mount id.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<(FileHandle, i32)> {
        let mut raw = RawHandle {
            handle_bytes: MAX_HANDLE_SZ as u32,
            handle_type: 0,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        let mut mount_id: libc::c_int = 0;
        // SAFETY: `raw` is a file_handle header followed by MAX_HANDLE_SZ writable bytes, as
        // handle_bytes says; the empty path with AT_EMPTY_PATH names the fd itself.
        check(unsafe {
            libc::name_to_handle_at(
                fd.as_raw_fd(),
                c"".as_ptr(),
                (&mut raw as *mut RawHandle).cast(),
                &mut mount_id,
                libc::AT_EMPTY_PATH,
            )
        })?;
        let n = (raw.handle_bytes as usize).min(MAX_HANDLE_SZ);
        Ok((
            FileHandle {
                kind: raw.handle_type,
                bytes: raw.f_handle[..n].into(),
            },
            mount_id,
        ))
    }

    /// Opens the file as an `O_PATH` fd; `mount_fd` is any non-`O_PATH` fd on its filesystem.
    /// Needs CAP_DAC_READ_SEARCH.
    pub fn open(&self, mount_fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        self.open_with(mount_fd, libc::O_PATH)
    }

    /// Opens the file with real access `flags` (O_CREAT/O_EXCL dropped), as [`reopen`] does
    /// for an `O_PATH` fd, in one call.
    pub fn open_file(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<File> {
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW);
        self.open_with(mount_fd, flags).map(File::from)
    }

    fn open_with(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
        let mut raw = RawHandle {
            handle_bytes: self.bytes.len() as u32,
            handle_type: self.kind,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        raw.f_handle[..self.bytes.len()].copy_from_slice(&self.bytes);
        // SAFETY: `raw` is a valid file_handle of handle_bytes bytes; the fd is new and ours.
        let fd = check(unsafe {
            libc::open_by_handle_at(
                mount_fd.as_raw_fd(),
                (&mut raw as *mut RawHandle).cast(),
                flags | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: just returned by open_by_handle_at, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Heap bytes this handle holds (for the stated per-inode memory).
    pub fn heap_size(&self) -> usize {
        self.bytes.len()
    }
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

/// The kernel's process events (the netlink proc connector), read for thread exits (what lets
/// the mount keep a thread's job cached without re-reading /proc on every request), execs (what
/// cuts a job into steps) and forks (which process made which, when its parent is gone). Needs
/// CAP_NET_ADMIN.
pub struct ExitEvents {
    sock: OwnedFd,
}

/// A thread's exit as the kernel reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub tid: i32,
    /// When it exited: CLOCK_MONOTONIC, ns.
    pub at_ns: u64,
}

/// A process's fork as the kernel reported it (threads are not forks here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    /// The process (thread group) that forked.
    pub parent: i32,
    pub child: i32,
    /// When: CLOCK_MONOTONIC, ns.
    pub at_ns: u64,
}

/// What [`ExitEvents::wait`] saw.
pub enum Exits {
    /// These processes were forked, these threads exited, and these processes (by pid) exec'd a
    /// new program (with when, CLOCK_MONOTONIC ns). Reported late when the reader lags (a
    /// machine busy with other processes): an exited thread's id may already belong to a new
    /// thread, which started after `at_ns`.
    Seen {
        forks: Vec<Fork>,
        exits: Vec<Exit>,
        execs: Vec<(i32, u64)>,
    },
    /// Events were lost (the socket's buffer overflowed): any cached thread may have exited.
    Lost,
}

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// sizeof(struct nlmsghdr) and sizeof(struct cn_msg).
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;

impl ExitEvents {
    pub fn open() -> io::Result<ExitEvents> {
        // SAFETY: plain socket/bind/send on a socket we own; the buffers are live locals.
        unsafe {
            let fd = check(libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_CONNECTOR,
            ))?;
            let sock = OwnedFd::from_raw_fd(fd);
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            addr.nl_groups = CN_IDX_PROC;
            check(libc::bind(
                fd,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            ))?;
            // nlmsghdr + cn_msg + the listen operation.
            let mut msg = [0u8; NLMSG_HDR + CN_MSG + 4];
            let len = msg.len() as u32;
            msg[0..4].copy_from_slice(&len.to_ne_bytes());
            msg[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
            msg[12..16].copy_from_slice(&std::process::id().to_ne_bytes());
            msg[16..20].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
            msg[20..24].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
            msg[32..34].copy_from_slice(&4u16.to_ne_bytes());
            msg[36..40].copy_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
            let sent = libc::send(fd, msg.as_ptr().cast(), msg.len(), 0);
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(ExitEvents { sock })
        }
    }

    /// Blocks until events arrive; returns the exits and execs among them.
    pub fn wait(&self, buf: &mut [u8]) -> io::Result<Exits> {
        // SAFETY: sockaddr_nl is plain old data.
        let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: recvfrom into a live, writable buffer of its length and a sockaddr_nl.
        let n = unsafe {
            libc::recvfrom(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_nl).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOBUFS) => Ok(Exits::Lost),
                _ => Err(e),
            };
        }
        if from.nl_pid != 0 {
            // Only the kernel speaks for the proc connector; anything else is dropped unread.
            return Ok(Exits::Seen {
                forks: Vec::new(),
                exits: Vec::new(),
                execs: Vec::new(),
            });
        }
        let mut forks = Vec::new();
        let mut exits = Vec::new();
        let mut execs = Vec::new();
        let mut rest = &buf[..n as usize];
        // Netlink messages, each: nlmsghdr (len first), cn_msg, proc_event {what, cpu,
        // timestamp_ns (u64), then the event's own fields}.
        while rest.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            if len < NLMSG_HDR || len > rest.len() {
                break;
            }
            let ev = &rest[NLMSG_HDR + CN_MSG..len.max(NLMSG_HDR + CN_MSG)];
            let word = |at: usize| {
                ev.get(at..at + 4)
                    .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
            };
            let at_ns = ev
                .get(8..16)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
            // exit: {pid, tgid, ...}; exec: {pid, tgid}; fork: {parent pid, parent tgid, child
            // pid, child tgid}, a thread when the child's pid is not its tgid.
            match (word(0), word(16), word(20), at_ns) {
                (Some(PROC_EVENT_EXIT), Some(tid), _, Some(at_ns)) => exits.push(Exit {
                    tid: tid as i32,
                    at_ns,
                }),
                (Some(PROC_EVENT_EXEC), _, Some(tgid), Some(at_ns)) => {
                    execs.push((tgid as i32, at_ns))
                }
                (Some(PROC_EVENT_FORK), _, Some(parent), Some(at_ns)) => {
                    if let (Some(child), Some(child_tgid)) = (word(24), word(28)) {
                        if child == child_tgid {
                            forks.push(Fork {
                                parent: parent as i32,
                                child: child as i32,
                                at_ns,
                            });
                        }
                    }
                }
                _ => {}
            }
            rest = &rest[((len + 3) & !3).min(rest.len())..];
        }
        Ok(Exits::Seen {
            forks,
            exits,
            execs,
        })
    }
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
