//! Hooks of the open family: open, openat and their 64-bit and fortified forms, creat, the
//! mkstemp family, fopen and freopen.

use super::*;

// ---- open family -------------------------------------------------------------------------------
// `mode` is variadic in C; on the supported ABIs it arrives in the register a fixed third argument
// would use, and it is only read by the kernel when O_CREAT/O_TMPFILE is set.

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let seen = unsafe { seen_flags(libc::AT_FDCWD, path, flags) };
    let fd = unsafe {
        real!(open: unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int)(path, flags, mode)
    };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let seen = unsafe { seen_flags(libc::AT_FDCWD, path, flags) };
    let fd = unsafe {
        real!(open64: unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int)(
            path, flags, mode,
        )
    };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    let seen = unsafe { seen_flags(libc::AT_FDCWD, path, flags) };
    let fd = unsafe {
        real!(__open_2: unsafe extern "C" fn(*const c_char, c_int) -> c_int)(path, flags)
    };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    let seen = unsafe { seen_flags(libc::AT_FDCWD, path, flags) };
    let fd = unsafe {
        real!(__open64_2: unsafe extern "C" fn(*const c_char, c_int) -> c_int)(path, flags)
    };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    let seen = unsafe { seen_flags(dirfd, path, flags) };
    let fd = unsafe {
        real!(openat: unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int)(
            dirfd, path, flags, mode,
        )
    };
    unsafe { after_open(dirfd, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    let seen = unsafe { seen_flags(dirfd, path, flags) };
    let fd = unsafe {
        real!(openat64: unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int)(
            dirfd, path, flags, mode,
        )
    };
    unsafe { after_open(dirfd, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let seen = unsafe { seen_flags(dirfd, path, flags) };
    let fd = unsafe {
        real!(__openat_2: unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int)(
            dirfd, path, flags,
        )
    };
    unsafe { after_open(dirfd, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let seen = unsafe { seen_flags(dirfd, path, flags) };
    let fd = unsafe {
        real!(__openat64_2: unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int)(
            dirfd, path, flags,
        )
    };
    unsafe { after_open(dirfd, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
    let seen = unsafe { seen_flags(libc::AT_FDCWD, path, flags) };
    let fd =
        unsafe { real!(creat: unsafe extern "C" fn(*const c_char, mode_t) -> c_int)(path, mode) };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
    let seen = unsafe { seen_flags(libc::AT_FDCWD, path, flags) };
    let fd =
        unsafe { real!(creat64: unsafe extern "C" fn(*const c_char, mode_t) -> c_int)(path, mode) };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
    fd
}

// mkstemp and friends open through glibc's internal open, which no PLT hook sees.
pub(super) const TEMP_FLAGS: c_int = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;

#[no_mangle]
pub unsafe extern "C" fn mkstemp(template: *mut c_char) -> c_int {
    let fd = unsafe { real!(mkstemp: unsafe extern "C" fn(*mut c_char) -> c_int)(template) };
    unsafe { after_open(libc::AT_FDCWD, template, TEMP_FLAGS, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp64(template: *mut c_char) -> c_int {
    let fd = unsafe { real!(mkstemp64: unsafe extern "C" fn(*mut c_char) -> c_int)(template) };
    unsafe { after_open(libc::AT_FDCWD, template, TEMP_FLAGS, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp(template: *mut c_char, flags: c_int) -> c_int {
    let fd = unsafe {
        real!(mkostemp: unsafe extern "C" fn(*mut c_char, c_int) -> c_int)(template, flags)
    };
    unsafe { after_open(libc::AT_FDCWD, template, TEMP_FLAGS | flags, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int {
    let fd = unsafe {
        real!(mkostemp64: unsafe extern "C" fn(*mut c_char, c_int) -> c_int)(template, flags)
    };
    unsafe { after_open(libc::AT_FDCWD, template, TEMP_FLAGS | flags, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps(template: *mut c_char, suffix: c_int) -> c_int {
    let fd = unsafe {
        real!(mkstemps: unsafe extern "C" fn(*mut c_char, c_int) -> c_int)(template, suffix)
    };
    unsafe { after_open(libc::AT_FDCWD, template, TEMP_FLAGS, fd) };
    fd
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    let fd = unsafe {
        real!(mkostemps: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int)(
            template, suffix, flags,
        )
    };
    unsafe { after_open(libc::AT_FDCWD, template, TEMP_FLAGS | flags, fd) };
    fd
}

/// open(2) flags equivalent to an fopen mode string.
pub(super) unsafe fn fopen_flags(mode: *const c_char) -> c_int {
    let m = unsafe { cstr(mode) };
    let plus = m.contains(&b'+');
    match (m.first(), plus) {
        (Some(b'r'), false) => libc::O_RDONLY,
        (Some(b'r'), true) => libc::O_RDWR,
        (Some(b'w'), p) => {
            (if p { libc::O_RDWR } else { libc::O_WRONLY }) | libc::O_CREAT | libc::O_TRUNC
        }
        (Some(b'a'), p) => {
            (if p { libc::O_RDWR } else { libc::O_WRONLY }) | libc::O_CREAT | libc::O_APPEND
        }
        _ => libc::O_RDONLY,
    }
}

/// The flags an fopen with `mode` of `path` is reported with ([`seen_flags`]), looked at before
/// the call.
pub(super) unsafe fn before_fopen(path: *const c_char, mode: *const c_char) -> c_int {
    if path.is_null() || mode.is_null() || !enabled() {
        return 0;
    }
    unsafe { seen_flags(libc::AT_FDCWD, path, fopen_flags(mode)) }
}

pub(super) unsafe fn after_fopen(path: *const c_char, seen: c_int, f: *mut FILE) {
    if f.is_null() || !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: f is a stream fopen just returned.
    let fd = unsafe { libc::fileno(f) };
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    let seen = unsafe { before_fopen(path, mode) };
    let f = unsafe {
        real!(fopen: unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE)(path, mode)
    };
    unsafe { after_fopen(path, seen, f) };
    f
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    let seen = unsafe { before_fopen(path, mode) };
    let f = unsafe {
        real!(fopen64: unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE)(path, mode)
    };
    unsafe { after_fopen(path, seen, f) };
    f
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    s: *mut FILE,
) -> *mut FILE {
    let seen = unsafe { before_fopen(path, mode) };
    let f = unsafe {
        real!(freopen: unsafe extern "C" fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE)(
            path, mode, s,
        )
    };
    if !path.is_null() {
        unsafe { after_fopen(path, seen, f) };
    }
    f
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    s: *mut FILE,
) -> *mut FILE {
    let seen = unsafe { before_fopen(path, mode) };
    let f = unsafe {
        real!(freopen64: unsafe extern "C" fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE)(
            path, mode, s,
        )
    };
    if !path.is_null() {
        unsafe { after_fopen(path, seen, f) };
    }
    f
}
