//! Hooks that change names (rename, link, symlink, unlink, remove, mkdir, rmdir), truncate a
//! file, or move the working directory the shim tracks.

use super::*;

// ---- namespace changes -------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    let r = unsafe {
        real!(rename: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int)(old, new)
    };
    if r == 0 {
        unsafe { report_pair(Kind::Rename, libc::AT_FDCWD, old, libc::AT_FDCWD, new) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    ofd: c_int,
    old: *const c_char,
    nfd: c_int,
    new: *const c_char,
) -> c_int {
    let r = unsafe {
        real!(renameat: unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char) -> c_int)(
            ofd, old, nfd, new,
        )
    };
    if r == 0 {
        unsafe { report_pair(Kind::Rename, ofd, old, nfd, new) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    ofd: c_int,
    old: *const c_char,
    nfd: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    let r = unsafe {
        real!(renameat2: unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(
            ofd, old, nfd, new, flags,
        )
    };
    if r == 0 {
        let kind = if flags & libc::RENAME_EXCHANGE != 0 {
            Kind::Exchange
        } else {
            Kind::Rename
        };
        unsafe { report_pair(kind, ofd, old, nfd, new) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    let r = unsafe {
        real!(symlink: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int)(target, path)
    };
    if r == 0 {
        unsafe { report_path(Kind::Symlink, libc::AT_FDCWD, path) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    let r = unsafe {
        real!(symlinkat: unsafe extern "C" fn(*const c_char, c_int, *const c_char) -> c_int)(
            target, dirfd, path,
        )
    };
    if r == 0 {
        unsafe { report_path(Kind::Symlink, dirfd, path) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    let r = unsafe { real!(unlink: unsafe extern "C" fn(*const c_char) -> c_int)(path) };
    if r == 0 {
        unsafe { report_path(Kind::Unlink, libc::AT_FDCWD, path) };
    }
    r
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

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let r = unsafe {
        real!(unlinkat: unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int)(
            dirfd, path, flags,
        )
    };
    if r == 0 {
        let kind = if flags & libc::AT_REMOVEDIR != 0 {
            Kind::Rmdir
        } else {
            Kind::Unlink
        };
        unsafe { report_path(kind, dirfd, path) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    let r = unsafe {
        real!(link: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int)(old, new)
    };
    if r == 0 {
        unsafe { report_pair(Kind::Link, libc::AT_FDCWD, old, libc::AT_FDCWD, new) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn linkat(
    ofd: c_int,
    old: *const c_char,
    nfd: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    let r = unsafe {
        real!(linkat: unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int)(
            ofd, old, nfd, new, flags,
        )
    };
    if r == 0 {
        unsafe { report_pair(Kind::Link, ofd, old, nfd, new) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    let r =
        unsafe { real!(truncate: unsafe extern "C" fn(*const c_char, off_t) -> c_int)(path, len) };
    if r == 0 {
        unsafe { report_path(Kind::Truncate, libc::AT_FDCWD, path) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off_t) -> c_int {
    let r = unsafe {
        real!(truncate64: unsafe extern "C" fn(*const c_char, off_t) -> c_int)(path, len)
    };
    if r == 0 {
        unsafe { report_path(Kind::Truncate, libc::AT_FDCWD, path) };
    }
    r
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
    if unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_nlink == 0 {
        return;
    }
    let mut buf = [0u8; PATH_MAX];
    let p = unsafe { fd_path(fd, &mut buf) };
    if p.first() == Some(&b'/') {
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

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    let r = unsafe { real!(ftruncate: unsafe extern "C" fn(c_int, off_t) -> c_int)(fd, len) };
    if r == 0 {
        unsafe { report_ftruncate(fd) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    let r = unsafe { real!(ftruncate64: unsafe extern "C" fn(c_int, off_t) -> c_int)(fd, len) };
    if r == 0 {
        unsafe { report_ftruncate(fd) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    let r =
        unsafe { real!(mkdir: unsafe extern "C" fn(*const c_char, mode_t) -> c_int)(path, mode) };
    if r == 0 {
        unsafe { report_path(Kind::Mkdir, libc::AT_FDCWD, path) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    let r = unsafe {
        real!(mkdirat: unsafe extern "C" fn(c_int, *const c_char, mode_t) -> c_int)(
            dirfd, path, mode,
        )
    };
    if r == 0 {
        unsafe { report_path(Kind::Mkdir, dirfd, path) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    let r = unsafe { real!(rmdir: unsafe extern "C" fn(*const c_char) -> c_int)(path) };
    if r == 0 {
        unsafe { report_path(Kind::Rmdir, libc::AT_FDCWD, path) };
    }
    r
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

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let r = unsafe { real!(chdir: unsafe extern "C" fn(*const c_char) -> c_int)(path) };
    if r == 0 {
        unsafe { refresh_cwd() };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let r = unsafe { real!(fchdir: unsafe extern "C" fn(c_int) -> c_int)(fd) };
    if r == 0 {
        unsafe { refresh_cwd() };
    }
    r
}
