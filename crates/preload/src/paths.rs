//! What a report says of a path: the base it is resolved against (the tracked cwd, or a dirfd
//! read through /proc/self/fd), the file an open found or made (`seen_flags` before the call,
//! `after_open` after it), and the one- and two-path reports the hooks share.

use super::*;

/// The directory a relative `path` is resolved against, written into `buf` when it must be read
/// from /proc. Empty for absolute paths.
pub(super) unsafe fn base<'a>(dirfd: c_int, path: &[u8], buf: &'a mut [u8; PATH_MAX]) -> &'a [u8] {
    if path.first() == Some(&b'/') {
        return &[];
    }
    if dirfd == libc::AT_FDCWD {
        let len = CWD_LEN.load(Ordering::Relaxed);
        // SAFETY: CWD is only written by chdir hooks; a torn read yields a wrong base, not UB
        // worse than the race the program itself has with its own chdir.
        return unsafe { &(&*ptr::addr_of!(CWD))[..len] };
    }
    // SAFETY: fd_path writes within buf.
    unsafe { fd_path(dirfd, buf) }
}

/// readlink("/proc/self/fd/N") into `buf`.
pub(super) unsafe fn fd_path(fd: c_int, buf: &mut [u8; PATH_MAX]) -> &[u8] {
    let mut link = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 11];
    let mut n = fd.max(0) as u32;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let d = &digits[i..];
    link[14..14 + d.len()].copy_from_slice(d);
    // SAFETY: link is NUL-terminated; buf is writable for its length.
    let len = unsafe { libc::readlink(link.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if len <= 0 {
        &[]
    } else {
        &buf[..len as usize]
    }
}

pub(super) fn wire_stat(st: &libc::stat) -> WireStat {
    WireStat {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        mode: st.st_mode,
        _pad: 0,
    }
}

/// The flags an open of `path` is reported with. An `O_CREAT` open without `O_EXCL` is looked at
/// first (one `fstatat`, as the open will resolve the path) so the report says whether the open
/// made the file: without `O_CREAT` when the path was there (the open could not have made it),
/// with `O_EXCL` added when it was not (the open made it, or failed). The engine reads those as
/// it reads any open with such flags; an open of a file that was there before is never taken for
/// one the job made, whatever its ctime (SEMANTICS.md: whether a file existed before the job).
pub(super) unsafe fn seen_flags(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let creates = flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT;
    if !creates || flags & libc::O_TMPFILE == libc::O_TMPFILE || path.is_null() || !enabled() {
        return flags;
    }
    let _errno = KeepErrno::new();
    let follow = if flags & libc::O_NOFOLLOW != 0 {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: fstatat into a zeroed struct, `path` the caller's C string.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: newfstatat into a stat of ours; `path` is the caller's C string, not null (checked above).
    let r = unsafe { libc::syscall(libc::SYS_newfstatat, dirfd, path, &mut st, follow) };
    // SAFETY: this thread's errno.
    let err = unsafe { *libc::__errno_location() };
    match (r, err) {
        (0, _) => flags & !libc::O_CREAT,
        (_, libc::ENOENT) => flags | libc::O_EXCL,
        _ => flags,
    }
}

/// Reports a successful open of a regular file; directories, devices and pipes are of no interest.
pub(super) unsafe fn after_open(dirfd: c_int, path: *const c_char, flags: c_int, fd: c_int) {
    if fd < 0 || !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat of an fd into a zeroed stat of ours.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return;
    }
    // SAFETY: a C string the caller passed (libc read it too), or null, which `cstr` checks.
    let p = unsafe { cstr(path) };
    let mut buf = [0u8; PATH_MAX];
    // SAFETY: `base` reads the slice it is given and writes only into its own buffer.
    let b = unsafe { base(dirfd, p, &mut buf) };
    // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
    unsafe {
        send(
            Kind::Open,
            flags as i64,
            fd,
            wire_stat(&st),
            [b, p, &[], &[]],
        )
    };
}

pub(super) unsafe fn report_path(kind: Kind, dirfd: c_int, path: *const c_char) {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: a C string the caller passed (libc read it too), or null, which `cstr` checks.
    let p = unsafe { cstr(path) };
    let mut buf = [0u8; PATH_MAX];
    // SAFETY: `base` reads the slice it is given and writes only into its own buffer.
    let b = unsafe { base(dirfd, p, &mut buf) };
    // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
    unsafe { send(kind, 0, -1, WireStat::default(), [b, p, &[], &[]]) };
}

pub(super) unsafe fn report_pair(
    kind: Kind,
    fd1: c_int,
    p1: *const c_char,
    fd2: c_int,
    p2: *const c_char,
) {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: a C string the caller passed (libc read it too), or null, which `cstr` checks.
    let (a, b) = unsafe { (cstr(p1), cstr(p2)) };
    let mut buf1 = [0u8; PATH_MAX];
    let mut buf2 = [0u8; PATH_MAX];
    // SAFETY: `base` reads the slice it is given and writes only into its own buffer.
    let (ba, bb) = unsafe { (base(fd1, a, &mut buf1), base(fd2, b, &mut buf2)) };
    // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
    unsafe { send(kind, 0, -1, WireStat::default(), [ba, a, bb, b]) };
}
