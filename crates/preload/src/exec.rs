//! Hooks of exec and posix_spawn: a program the shim will not be loaded into is reported
//! (`followable`), LD_PRELOAD and the run's variables are put back into an environment a program
//! scrubbed, and posix_spawn's file actions are reported as the opens they are.

use super::*;

/// Reports an exec of a program the shim will not be loaded into (see `followable`). `search`:
/// `file` is looked up in the PATH of `envp` as execvp does.
pub(super) unsafe fn check_exec(file: *const c_char, search: bool, envp: *const *const c_char) {
    if !enabled() || file.is_null() {
        return;
    }
    // The objects this image loaded go with it.
    // SAFETY: `report` reads only what `dl_iterate_phdr` hands it, under the loader's lock.
    unsafe { loaded::report() };
    let _errno = KeepErrno::new();
    // SAFETY: exec's own argument, a C string.
    let f = unsafe { CStr::from_ptr(file) }.to_bytes_with_nul();
    let mut found = [0u8; PATH_MAX];
    let path: &[u8] = if search && !f.contains(&b'/') {
        // SAFETY: the caller's file name (not null: checked above), its environment (null is
        // checked inside) and a buffer of ours.
        match unsafe { followable::search_path(f, envp, &mut found) } {
            Some(p) => p,
            None => return,
        }
    } else {
        f
    };
    if let Some(why) = followable::judge(path) {
        let p = &path[..path.len() - 1];
        let mut buf = [0u8; PATH_MAX];
        // SAFETY: `base` reads the slice it is given and writes only into its own buffer.
        let b = unsafe { base(libc::AT_FDCWD, p, &mut buf) };
        // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
        unsafe {
            send(
                Kind::Untraced,
                why as i64,
                -1,
                WireStat::default(),
                [b, p, &[], &[]],
            )
        };
    }
}

// ---- exec: keep the shim in environments that a program scrubbed -------------------------------

pub(super) const ENV_SLOTS: usize = 1024;

pub(super) unsafe fn starts_with(entry: *const c_char, prefix: &[u8]) -> bool {
    // SAFETY: a C string the caller passed (libc read it too), or null, which `cstr` checks.
    unsafe { cstr(entry) }.starts_with(prefix)
}

/// Returns `envp`, or a copy in `out` with roar's variables and LD_PRELOAD put back.
pub(super) unsafe fn fix_env(
    envp: *const *const c_char,
    out: &mut [*const c_char; ENV_SLOTS],
    preload: &mut [u8; 2 * PATH_MAX],
) -> *const *const c_char {
    let lib_len = LIB_LEN.load(Ordering::Relaxed);
    if !enabled() || lib_len == 0 || envp.is_null() {
        return envp;
    }
    // SAFETY: the entries were written by the constructor and are NUL-terminated.
    let (lib_entry, sock_entry, ring_entry) = unsafe {
        (
            &*ptr::addr_of!(LIB_ENTRY),
            &*ptr::addr_of!(SOCK_ENTRY),
            &*ptr::addr_of!(RING_ENTRY),
        )
    };
    let lib = &lib_entry[LIB_ENV.len() + 1..LIB_ENV.len() + 1 + lib_len];
    // Without a ring of its own, this process has nothing to pass on.
    let mut has_ring = RING_LEN.load(Ordering::Relaxed) == 0;
    let (mut has_sock, mut has_lib, mut preload_at, mut n) = (false, false, None, 0usize);
    // SAFETY: envp is a NULL-terminated array supplied to exec.
    unsafe {
        while !(*envp.add(n)).is_null() {
            let e = *envp.add(n);
            has_sock |=
                starts_with(e, SOCK_ENV.as_bytes()) && cstr(e).get(SOCK_ENV.len()) == Some(&b'=');
            has_lib |=
                starts_with(e, LIB_ENV.as_bytes()) && cstr(e).get(LIB_ENV.len()) == Some(&b'=');
            has_ring |=
                starts_with(e, RING_ENV.as_bytes()) && cstr(e).get(RING_ENV.len()) == Some(&b'=');
            if starts_with(e, b"LD_PRELOAD=") {
                preload_at = Some(n);
            }
            n += 1;
        }
    }
    let preload_ok = preload_at.is_some_and(|i| {
        // SAFETY: i < n, a valid entry.
        let v = unsafe { cstr(*envp.add(i)) };
        v.windows(lib.len()).any(|w| w == lib)
    });
    if has_sock && has_lib && has_ring && preload_ok {
        return envp;
    }
    if n + 5 > ENV_SLOTS {
        return envp;
    }
    // LD_PRELOAD=<ours>[:<theirs>]
    let mut len = 0;
    for part in [b"LD_PRELOAD=".as_slice(), lib] {
        preload[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    if let Some(i) = preload_at {
        // SAFETY: i < n.
        let theirs = unsafe { &cstr(*envp.add(i))[b"LD_PRELOAD=".len()..] };
        if !theirs.is_empty() && len + 1 + theirs.len() < preload.len() {
            preload[len] = b':';
            preload[len + 1..len + 1 + theirs.len()].copy_from_slice(theirs);
            len += 1 + theirs.len();
        }
    }
    preload[len] = 0;
    let mut k = 0;
    for i in 0..n {
        if Some(i) == preload_at {
            continue;
        }
        // SAFETY: i < n.
        out[k] = unsafe { *envp.add(i) };
        k += 1;
    }
    out[k] = preload.as_ptr().cast();
    k += 1;
    if !has_sock {
        out[k] = sock_entry.as_ptr().cast();
        k += 1;
    }
    if !has_lib {
        out[k] = lib_entry.as_ptr().cast();
        k += 1;
    }
    if !has_ring {
        out[k] = ring_entry.as_ptr().cast();
        k += 1;
    }
    out[k] = ptr::null();
    out.as_ptr()
}

extern "C" {
    static environ: *const *const c_char;
}

pub(super) type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut out = [ptr::null(); ENV_SLOTS];
    let mut preload = [0u8; 2 * PATH_MAX];
    // SAFETY: the caller's environment (a NULL-terminated array, as exec requires, or null: checked); the copy is written into `out`, which outlives the exec call.
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    // SAFETY: the caller's path (a C string, or null: checked) and the environment made above.
    unsafe { check_exec(path, false, env) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(execve: ExecveFn)(path, argv, env) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and this process's `environ`, as libc's execv passes them.
    unsafe { execve(path, argv, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut out = [ptr::null(); ENV_SLOTS];
    let mut preload = [0u8; 2 * PATH_MAX];
    // SAFETY: the caller's environment (a NULL-terminated array, as exec requires, or null: checked); the copy is written into `out`, which outlives the exec call.
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    // SAFETY: the caller's path (a C string, or null: checked) and the environment made above.
    unsafe { check_exec(file, true, env) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(execvpe: ExecveFn)(file, argv, env) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and this process's `environ`, as libc's execvp passes them.
    unsafe { execvpe(file, argv, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut out = [ptr::null(); ENV_SLOTS];
    let mut preload = [0u8; 2 * PATH_MAX];
    // SAFETY: the caller's environment (a NULL-terminated array, as exec requires, or null: checked); the copy is written into `out`, which outlives the exec call.
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe {
        real!(fexecve: unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int)(
            fd, argv, env,
        )
    }
}

pub(super) type SpawnFn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

/// glibc's `posix_spawn_file_actions_t` as its `spawn_int.h` lays it out (the same since glibc
/// 2.2: later glibcs added actions after `spawn_do_open`, none larger than an open).
#[repr(C)]
pub(super) struct FileActions {
    allocated: c_int,
    used: c_int,
    actions: *const SpawnAction,
    pad: [c_int; 16],
}

#[repr(C)]
pub(super) struct SpawnAction {
    tag: c_int,
    open: OpenAction,
}

#[repr(C)]
pub(super) struct OpenAction {
    fd: c_int,
    path: *const c_char,
    oflag: c_int,
    mode: libc::mode_t,
}

pub(super) const SPAWN_DO_OPEN: c_int = 2;
pub(super) const SPAWN_DO_CHDIR: c_int = 3;
pub(super) const SPAWN_DO_FCHDIR: c_int = 4;

/// Reports the opens a successful spawn's file actions made: glibc makes them in the child with
/// its own open, which no hook sees (`make`'s and Python's redirections, `cc -o` through a
/// driver). Reported by the spawning process once the child runs, with the file as it is then.
/// Opens after a `chdir` action are relative to a directory the shim never saw: not reported.
pub(super) unsafe fn report_spawn_opens(actions: *const libc::posix_spawn_file_actions_t) {
    if actions.is_null() || !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: the caller's initialised file actions, read as glibc lays them out.
    let fa = unsafe { &*actions.cast::<FileActions>() };
    if fa.actions.is_null() || fa.used <= 0 || fa.used > fa.allocated {
        return;
    }
    for i in 0..fa.used as usize {
        // SAFETY: `used` entries of `actions` are initialised.
        let a = unsafe { &*fa.actions.add(i) };
        match a.tag {
            SPAWN_DO_OPEN if !a.open.path.is_null() => {}
            SPAWN_DO_CHDIR | SPAWN_DO_FCHDIR => return,
            _ => continue,
        }
        // SAFETY: stat into a zeroed struct, of the action's C string.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: stat of a C string (not null: checked) into a zeroed stat of ours.
        if unsafe { libc::stat(a.open.path, &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
        {
            continue;
        }
        // SAFETY: a C string the caller passed (libc read it too), or null, which `cstr` checks.
        let p = unsafe { cstr(a.open.path) };
        let mut buf = [0u8; PATH_MAX];
        // SAFETY: `base` reads the slice it is given and writes only into its own buffer.
        let b = unsafe { base(libc::AT_FDCWD, p, &mut buf) };
        // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
        unsafe {
            send(
                Kind::Open,
                a.open.oflag as i64,
                -1,
                wire_stat(&st),
                [b, p, &[], &[]],
            )
        };
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut out = [ptr::null(); ENV_SLOTS];
    let mut preload = [0u8; 2 * PATH_MAX];
    // SAFETY: the caller's environment (a NULL-terminated array, as exec requires, or null: checked); the copy is written into `out`, which outlives the exec call.
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    // SAFETY: the caller's path (a C string, or null: checked) and the environment made above.
    unsafe { check_exec(path, false, env) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let r = unsafe { real!(posix_spawn: SpawnFn)(pid, path, actions, attr, argv, env) };
    if r == 0 {
        // SAFETY: the caller's file actions, which posix_spawn has just read (null: checked).
        unsafe { report_spawn_opens(actions) };
        if !pid.is_null() {
            // SAFETY: posix_spawn wrote the child's pid there.
            unsafe { vouch_for(*pid) };
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut out = [ptr::null(); ENV_SLOTS];
    let mut preload = [0u8; 2 * PATH_MAX];
    // SAFETY: the caller's environment (a NULL-terminated array, as exec requires, or null: checked); the copy is written into `out`, which outlives the exec call.
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    // SAFETY: the caller's path (a C string, or null: checked) and the environment made above.
    unsafe { check_exec(file, true, env) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let r = unsafe { real!(posix_spawnp: SpawnFn)(pid, file, actions, attr, argv, env) };
    if r == 0 {
        // SAFETY: the caller's file actions, which posix_spawn has just read (null: checked).
        unsafe { report_spawn_opens(actions) };
        if !pid.is_null() {
            // SAFETY: posix_spawn wrote the child's pid there.
            unsafe { vouch_for(*pid) };
        }
    }
    r
}
