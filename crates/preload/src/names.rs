//! Hooks that change names (rename, link, symlink, unlink, remove, mkdir, rmdir), truncate a
//! file, or move the working directory the shim tracks.

use super::*;

// ---- namespace changes -------------------------------------------------------------------------

hook! {
    fn rename(old: *const c_char, new: *const c_char) -> c_int;
    |r| if r == 0 { report_pair(Kind::Rename, libc::AT_FDCWD, old, libc::AT_FDCWD, new) }
}

hook! {
    fn renameat(ofd: c_int, old: *const c_char, nfd: c_int, new: *const c_char) -> c_int;
    |r| if r == 0 { report_pair(Kind::Rename, ofd, old, nfd, new) }
}

hook! {
    fn renameat2(ofd: c_int, old: *const c_char, nfd: c_int, new: *const c_char, flags: c_uint) -> c_int;
    |r| if r == 0 {
        let kind = if flags & libc::RENAME_EXCHANGE != 0 { Kind::Exchange } else { Kind::Rename };
        report_pair(kind, ofd, old, nfd, new)
    }
}

hook! {
    fn symlink(target: *const c_char, path: *const c_char) -> c_int;
    |r| if r == 0 { report_path(Kind::Symlink, libc::AT_FDCWD, path) }
}

hook! {
    fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int;
    |r| if r == 0 { report_path(Kind::Symlink, dirfd, path) }
}

hook! {
    fn unlink(path: *const c_char) -> c_int;
    |r| if r == 0 { report_path(Kind::Unlink, libc::AT_FDCWD, path) }
}

/// glibc's `remove` calls its own unlink and rmdir, which no hook sees (rust-lld removes its
/// temporaries this way): done here as glibc does it — unlink, then rmdir where the path is a
/// directory — through the hooks above and below, so each success is reported.
#[no_mangle]
pub unsafe extern "C" fn remove(path: *const c_char) -> c_int {
    // SAFETY: the caller's path, passed on as it came.
    let r = unsafe { unlink(path) };
    if r == 0 {
        return 0;
    }
    // SAFETY: __errno_location always returns this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    if e != libc::EISDIR && e != libc::EPERM {
        return r;
    }
    // SAFETY: as above.
    unsafe { rmdir(path) }
}

hook! {
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    |r| if r == 0 {
        let kind = if flags & libc::AT_REMOVEDIR != 0 { Kind::Rmdir } else { Kind::Unlink };
        report_path(kind, dirfd, path)
    }
}

hook! {
    fn link(old: *const c_char, new: *const c_char) -> c_int;
    |r| if r == 0 { report_pair(Kind::Link, libc::AT_FDCWD, old, libc::AT_FDCWD, new) }
}

hook! {
    fn linkat(ofd: c_int, old: *const c_char, nfd: c_int, new: *const c_char, flags: c_int) -> c_int;
    |r| if r == 0 { report_pair(Kind::Link, ofd, old, nfd, new) }
}

hook! {
    fn truncate(path: *const c_char, len: off_t) -> c_int;
    |r| if r == 0 { report_path(Kind::Truncate, libc::AT_FDCWD, path) }
}

hook! {
    fn truncate64(path: *const c_char, len: off_t) -> c_int;
    |r| if r == 0 { report_path(Kind::Truncate, libc::AT_FDCWD, path) }
}

pub(super) unsafe fn report_ftruncate(fd: c_int) {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // A file with no name left (unlinked while open: its /proc link reads "PATH (deleted)") was
    // truncated at no path.
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: fstat of an fd into a zeroed stat of ours.
    if unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_nlink == 0 {
        return;
    }
    let mut buf = [0u8; PATH_MAX];
    // SAFETY: `fd_path` reads /proc/self/fd/N into the buffer it is given.
    let p = unsafe { fd_path(fd, &mut buf) };
    if p.first() == Some(&b'/') {
        // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
        unsafe {
            send(
                Kind::Truncate,
                0,
                fd,
                WireStat::default(),
                [&[], p, &[], &[]],
            )
        };
    }
}

hook! {
    fn ftruncate(fd: c_int, len: off_t) -> c_int;
    |r| if r == 0 { report_ftruncate(fd) }
}

hook! {
    fn ftruncate64(fd: c_int, len: off_t) -> c_int;
    |r| if r == 0 { report_ftruncate(fd) }
}

hook! {
    fn mkdir(path: *const c_char, mode: mode_t) -> c_int;
    |r| if r == 0 { report_path(Kind::Mkdir, libc::AT_FDCWD, path) }
}

hook! {
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    |r| if r == 0 { report_path(Kind::Mkdir, dirfd, path) }
}

hook! {
    fn rmdir(path: *const c_char) -> c_int;
    |r| if r == 0 { report_path(Kind::Rmdir, libc::AT_FDCWD, path) }
}

// ---- working directory -------------------------------------------------------------------------

pub(super) unsafe fn refresh_cwd() {
    let _errno = KeepErrno::new();
    // SAFETY: getcwd writes at most PATH_MAX bytes into CWD.
    unsafe {
        let buf = &mut *ptr::addr_of_mut!(CWD);
        if libc::getcwd(buf.as_mut_ptr().cast(), buf.len()).is_null() {
            CWD_LEN.store(0, Ordering::Relaxed);
        } else {
            CWD_LEN.store(cstr(buf.as_ptr().cast()).len(), Ordering::Relaxed);
        }
    }
}

hook! {
    fn chdir(path: *const c_char) -> c_int;
    |r| if r == 0 { refresh_cwd() }
}

hook! {
    fn fchdir(fd: c_int) -> c_int;
    |r| if r == 0 { refresh_cwd() }
}
