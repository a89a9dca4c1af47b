//! Hooks of the open family: open, openat and their 64-bit and fortified forms, creat, the
//! mkstemp family, fopen and freopen.

use super::*;

// ---- open family -------------------------------------------------------------------------------
// `mode` is variadic in C; on the supported ABIs it arrives in the register a fixed third argument
// would use, and it is only read by the kernel when O_CREAT/O_TMPFILE is set.

hook! {
    fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    let seen = seen_flags(libc::AT_FDCWD, path, flags);
    |fd| after_open(libc::AT_FDCWD, path, seen, fd)
}

hook! {
    fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    let seen = seen_flags(libc::AT_FDCWD, path, flags);
    |fd| after_open(libc::AT_FDCWD, path, seen, fd)
}

hook! {
    fn __open_2(path: *const c_char, flags: c_int) -> c_int;
    let seen = seen_flags(libc::AT_FDCWD, path, flags);
    |fd| after_open(libc::AT_FDCWD, path, seen, fd)
}

hook! {
    fn __open64_2(path: *const c_char, flags: c_int) -> c_int;
    let seen = seen_flags(libc::AT_FDCWD, path, flags);
    |fd| after_open(libc::AT_FDCWD, path, seen, fd)
}

hook! {
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    let seen = seen_flags(dirfd, path, flags);
    |fd| after_open(dirfd, path, seen, fd)
}

hook! {
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int;
    let seen = seen_flags(dirfd, path, flags);
    |fd| after_open(dirfd, path, seen, fd)
}

hook! {
    fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    let seen = seen_flags(dirfd, path, flags);
    |fd| after_open(dirfd, path, seen, fd)
}

hook! {
    fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    let seen = seen_flags(dirfd, path, flags);
    |fd| after_open(dirfd, path, seen, fd)
}

hook! {
    fn creat(path: *const c_char, mode: mode_t) -> c_int;
    let seen = seen_flags(libc::AT_FDCWD, path, CREAT_FLAGS);
    |fd| after_open(libc::AT_FDCWD, path, seen, fd)
}

hook! {
    fn creat64(path: *const c_char, mode: mode_t) -> c_int;
    let seen = seen_flags(libc::AT_FDCWD, path, CREAT_FLAGS);
    |fd| after_open(libc::AT_FDCWD, path, seen, fd)
}

/// `creat`'s flags: what the kernel opens it with.
const CREAT_FLAGS: c_int = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;

// mkstemp and friends open through glibc's internal open, which no PLT hook sees.
pub(super) const TEMP_FLAGS: c_int = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;

hook! {
    fn mkstemp(template: *mut c_char) -> c_int;
    |fd| after_open(libc::AT_FDCWD, template, TEMP_FLAGS, fd)
}

hook! {
    fn mkstemp64(template: *mut c_char) -> c_int;
    |fd| after_open(libc::AT_FDCWD, template, TEMP_FLAGS, fd)
}

hook! {
    fn mkostemp(template: *mut c_char, flags: c_int) -> c_int;
    |fd| after_open(libc::AT_FDCWD, template, TEMP_FLAGS | flags, fd)
}

hook! {
    fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int;
    |fd| after_open(libc::AT_FDCWD, template, TEMP_FLAGS | flags, fd)
}

hook! {
    fn mkstemps(template: *mut c_char, suffix: c_int) -> c_int;
    |fd| after_open(libc::AT_FDCWD, template, TEMP_FLAGS, fd)
}

hook! {
    fn mkostemps(template: *mut c_char, suffix: c_int, flags: c_int) -> c_int;
    |fd| after_open(libc::AT_FDCWD, template, TEMP_FLAGS | flags, fd)
}

/// open(2) flags equivalent to an fopen mode string.
pub(super) unsafe fn fopen_flags(mode: *const c_char) -> c_int {
    // SAFETY: a C string the caller passed (libc read it too), or null, which `cstr` checks.
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
    // SAFETY: the caller's path, a C string or null (checked before it is read).
    unsafe { seen_flags(libc::AT_FDCWD, path, fopen_flags(mode)) }
}

pub(super) unsafe fn after_fopen(path: *const c_char, seen: c_int, f: *mut FILE) {
    if f.is_null() || !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: f is a stream fopen just returned.
    let fd = unsafe { libc::fileno(f) };
    // SAFETY: the caller's path, as the open accepted it; a failed open (fd < 0) is checked.
    unsafe { after_open(libc::AT_FDCWD, path, seen, fd) };
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's path and mode, C strings or null (checked before they are read).
    let seen = unsafe { before_fopen(path, mode) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let f = unsafe {
        real!(fopen: unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE)(path, mode)
    };
    // SAFETY: the caller's path, as fopen accepted it; a null stream is checked.
    unsafe { after_fopen(path, seen, f) };
    f
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's path and mode, C strings or null (checked before they are read).
    let seen = unsafe { before_fopen(path, mode) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let f = unsafe {
        real!(fopen64: unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE)(path, mode)
    };
    // SAFETY: the caller's path, as fopen accepted it; a null stream is checked.
    unsafe { after_fopen(path, seen, f) };
    f
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    s: *mut FILE,
) -> *mut FILE {
    // SAFETY: the caller's path and mode, C strings or null (checked before they are read).
    let seen = unsafe { before_fopen(path, mode) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let f = unsafe {
        real!(freopen: unsafe extern "C" fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE)(
            path, mode, s,
        )
    };
    if !path.is_null() {
        // SAFETY: the caller's path, as fopen accepted it; a null stream is checked.
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
    // SAFETY: the caller's path and mode, C strings or null (checked before they are read).
    let seen = unsafe { before_fopen(path, mode) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let f = unsafe {
        real!(freopen64: unsafe extern "C" fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE)(
            path, mode, s,
        )
    };
    if !path.is_null() {
        // SAFETY: the caller's path, as fopen accepted it; a null stream is checked.
        unsafe { after_fopen(path, seen, f) };
    }
    f
}
