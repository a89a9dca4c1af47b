//! roar's LD_PRELOAD shim: interposes libc's file, exec and process calls in traced programs and
//! reports each successful access to the `roar run` that started them: into the shared-memory ring
//! roar maps for the run (no system call per event), or as one datagram on roar's socket when the
//! ring cannot be mapped (another user, no /proc) or the event does not fit.
//!
//! Rules inside a hook: no allocation, no std I/O, no panics, errno preserved, the real call made
//! exactly once with the caller's arguments and its result returned untouched. Paths are sent as
//! the program gave them plus a base directory (the tracked cwd, or a dirfd resolved through
//! /proc/self/fd); roar joins them, so the hot path never canonicalises anything.
//!
//! `no_std`, built with `panic = "abort"` (its own workspace: Cargo.toml): every traced process
//! loads it, and std cost each of them libgcc_s and ~400 KiB more to map (0.15 ms an exec;
//! bench/NOTES.md, "The fixed cost, cut by cut").
#![cfg_attr(not(test), no_std)]
#![allow(clippy::missing_safety_doc)]

mod followable;

use core::ffi::{c_char, c_int, c_uint, c_void, CStr};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};

use libc::{mode_t, off_t, pid_t, FILE};
use roar_wire::ring::{Ring, RING_ENV};
use roar_wire::{Header, Kind, WireStat, KEY_LEN, LIB_ENV, SOCK_ENV};

const PATH_MAX: usize = 4096;
/// Our socket is moved to a high fd so programs that assume small fds are unaffected.
const SOCK_FD_MIN: c_int = 800;

/// Our datagram socket: -1 none (off, or the connect failed), [`UNCONNECTED`] until the first
/// event that needs it (one too big for the ring, or a process without the ring), so a program
/// whose events all go through the ring never has a descriptor of ours.
static SOCK: AtomicI32 = AtomicI32::new(-1);
const UNCONNECTED: c_int = -2;
/// This process's pid, set by the constructor and in the child of a hooked fork (saves a syscall
/// per event; a child made by a raw clone that never execs reports its parent's pid).
static PID: AtomicI32 = AtomicI32::new(0);
/// Set in the child of a hooked vfork, which shares this memory with its suspended parent and so
/// cannot have its own [`PID`]; cleared when the parent resumes. While set, events ask the kernel
/// for the pid: a shell opens the redirections of `sort a > b` in such a child, before it execs
/// sort, and the step that owns b is found by that pid (SEMANTICS.md "Steps").
static IN_VFORK: AtomicBool = AtomicBool::new(false);

/// The pid events are reported under (see [`IN_VFORK`]).
fn event_pid() -> i32 {
    if IN_VFORK.load(Ordering::Relaxed) {
        // SAFETY: no preconditions.
        unsafe { libc::getpid() }
    } else {
        PID.load(Ordering::Relaxed)
    }
}

/// Everything below is written once by the constructor, before any other thread exists.
static mut SOCK_NAME: [u8; 108] = [0; 108];
static SOCK_NAME_LEN: AtomicUsize = AtomicUsize::new(0);
/// "ROAR_INTERNAL_SOCK=...", "ROAR_INTERNAL_RING=..." and "ROAR_INTERNAL_LIB=...", NUL-terminated,
/// for exec environments.
static mut SOCK_ENTRY: [u8; 160] = [0; 160];
/// The run's key, appended to every datagram (see `roar_wire::SOCK_ENV`).
static mut KEY: [u8; KEY_LEN] = [0; KEY_LEN];
static mut RING_ENTRY: [u8; 512] = [0; 512];
static RING_LEN: AtomicUsize = AtomicUsize::new(0);
/// The ring's mapping (`RING_MAP_LEN` bytes), null if this process has none.
static RING_MAP: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());
static RING_MAP_LEN: AtomicUsize = AtomicUsize::new(0);
/// `<ring file>.late`: where events go once roar is gone (its ring full, its socket closed), so
/// the job recovered from roar's journal still holds them. Set only for a ring that is a file.
static mut LATE: [u8; PATH_MAX + 8] = [0; PATH_MAX + 8];
static LATE_LEN: AtomicUsize = AtomicUsize::new(0);
/// roar's ring is full and roar is gone: events skip the ring and the socket.
static ROAR_GONE: AtomicBool = AtomicBool::new(false);
static mut LIB_ENTRY: [u8; PATH_MAX + 32] = [0; PATH_MAX + 32];
static LIB_LEN: AtomicUsize = AtomicUsize::new(0);
/// Scratch for the argv of the Exec event, used only by the constructor.
static mut ARGV_BUF: [u8; 32 * 1024] = [0; 32 * 1024];

/// The current directory as this process last set it. Forked children inherit it with the memory.
static mut CWD: [u8; PATH_MAX] = [0; PATH_MAX];
static CWD_LEN: AtomicUsize = AtomicUsize::new(0);

macro_rules! real {
    ($name:ident : $ty:ty) => {{
        static P: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
        let mut p = P.load(Ordering::Relaxed);
        if p.is_null() {
            #[allow(unused_unsafe)]
            // SAFETY: the symbol name is a NUL-terminated literal.
            let found = unsafe {
                libc::dlsym(
                    libc::RTLD_NEXT,
                    concat!(stringify!($name), "\0").as_ptr().cast(),
                )
            };
            p = found;
            P.store(p, Ordering::Relaxed);
        }
        #[allow(unused_unsafe)]
        // SAFETY: libc's symbol of this name has this signature.
        let f = unsafe { core::mem::transmute::<*mut c_void, $ty>(p) };
        f
    }};
}

/// An exported hook of libc's `$name`, for the hooks of one shape: `let $v = $before;` (what
/// must be looked at before the call, optional), the real function called once with the
/// caller's arguments unchanged, then `$after` with its result `$r`, which is returned as it
/// came. The safety reasoning is the same for every such hook, so it is written once, here.
/// (Invoked with braces, `hook! { ... }`, which rustfmt leaves as written.)
macro_rules! hook {
    (fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;
     $(let $v:ident = $before:expr;)?
     |$r:ident| $after:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $(
                // SAFETY: the caller's own arguments, as it hands them to libc: a path is a C
                // string or null, and the shim's helpers read it only when it is not null.
                let $v = unsafe { $before };
            )?
            // SAFETY: libc's function of this name and signature, called once with the
            // caller's arguments unchanged: the caller's contract with libc is met as it was.
            let $r = unsafe { real!($name: unsafe extern "C" fn($($ty),*) -> $ret)($($arg),*) };
            // SAFETY: as above: the arguments are the caller's, and reports read a path only
            // where the real call accepted it.
            #[allow(unused_unsafe)]
            unsafe {
                $after
            };
            $r
        }
    };
}

mod loaded;

// After `real!`: a macro is in scope only below its definition.
mod exec;
mod names;
mod open;
mod paths;
mod process;
mod transport;

use names::*;
use paths::*;
use process::*;
use transport::*;

/// Saves errno on creation and restores it on drop, so reporting never disturbs the caller.
struct KeepErrno(c_int);

impl KeepErrno {
    fn new() -> KeepErrno {
        // SAFETY: __errno_location always returns this thread's errno.
        KeepErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

fn enabled() -> bool {
    SOCK.load(Ordering::Relaxed) != -1 || RING_LEN.load(Ordering::Relaxed) > 0
}

// ---- constructor -------------------------------------------------------------------------------

unsafe fn copy_entry(dst: &mut [u8], name: &str, value: &[u8]) -> usize {
    let total = name.len() + 1 + value.len();
    if total + 1 > dst.len() {
        return 0;
    }
    dst[..name.len()].copy_from_slice(name.as_bytes());
    dst[name.len()] = b'=';
    dst[name.len() + 1..total].copy_from_slice(value);
    dst[total] = 0;
    value.len()
}

unsafe extern "C" fn init(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    // The program starts with errno as the loader left it, whatever the shim's calls below do.
    let _errno = KeepErrno::new();
    // SAFETY: the constructor runs once, before main and before any thread of the program exists.
    unsafe {
        let sock_env = cstr(libc::getenv(c"ROAR_INTERNAL_SOCK".as_ptr()));
        let lib = cstr(libc::getenv(c"ROAR_INTERNAL_LIB".as_ptr()));
        let Some((sock, key)) = roar_wire::split_sock_env(sock_env) else {
            return;
        };
        if sock.len() > 100 {
            return;
        }
        (&mut *ptr::addr_of_mut!(SOCK_NAME))[..sock.len()].copy_from_slice(sock);
        SOCK_NAME_LEN.store(sock.len(), Ordering::Relaxed);
        *ptr::addr_of_mut!(KEY) = key;
        copy_entry(&mut *ptr::addr_of_mut!(SOCK_ENTRY), SOCK_ENV, sock_env);
        let ring = cstr(libc::getenv(c"ROAR_INTERNAL_RING".as_ptr()));
        if map_ring(ring) > 0 {
            RING_LEN.store(
                copy_entry(&mut *ptr::addr_of_mut!(RING_ENTRY), RING_ENV, ring),
                Ordering::Relaxed,
            );
        }
        LIB_LEN.store(
            copy_entry(&mut *ptr::addr_of_mut!(LIB_ENTRY), LIB_ENV, lib),
            Ordering::Relaxed,
        );
        PID.store(libc::getpid(), Ordering::Relaxed);
        refresh_cwd();
        SOCK.store(UNCONNECTED, Ordering::Relaxed);

        let args = &mut *ptr::addr_of_mut!(ARGV_BUF);
        let mut len = 0;
        for i in 0..argc.max(0) as usize {
            let a = cstr(*argv.add(i));
            if len + a.len() + 1 > args.len() {
                break;
            }
            if i > 0 {
                args[len] = 0;
                len += 1;
            }
            args[len..len + a.len()].copy_from_slice(a);
            len += a.len();
        }
        let mut exe = [0u8; PATH_MAX];
        let n = libc::readlink(
            c"/proc/self/exe".as_ptr(),
            exe.as_mut_ptr().cast(),
            exe.len(),
        );
        let exe = if n > 0 { &exe[..n as usize] } else { &[][..] };
        let cwd = &(&*ptr::addr_of!(CWD))[..CWD_LEN.load(Ordering::Relaxed)];
        let ppid = libc::getppid();
        let mut ids = [(0u8, 0u64, 0u64); 3];
        for (fd, id) in ids.iter_mut().enumerate() {
            let mut st: libc::stat = core::mem::zeroed();
            if libc::fstat(fd as c_int, &mut st) == 0 {
                let kind = match st.st_mode & libc::S_IFMT {
                    libc::S_IFREG => roar_wire::STREAM_FILE,
                    // A stdin pipe nobody can write to carries nothing (GNU make gives every
                    // parallel recipe but one such a pipe): no data channel.
                    libc::S_IFIFO if fd == 0 && dead_pipe(0) => 0,
                    libc::S_IFIFO | libc::S_IFSOCK => roar_wire::STREAM_PIPE,
                    _ => 0,
                };
                *id = (kind, st.st_dev, st.st_ino);
            }
        }
        let stdio = roar_wire::encode_stdio(&ids);
        send(
            Kind::Exec,
            ppid as i64,
            -1,
            WireStat::default(),
            [cwd, exe, &args[..len], &stdio],
        );
        loaded::report();
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) = init;

/// A panic cannot unwind out of the shim (there is no unwinder) and must not return into the
/// program: it aborts the process, as `panic = "abort"` would. The hooks are written not to panic
/// (no indexing that can fail, no allocation); this is the last resort. (A test build links std,
/// which has its own.)
#[cfg(not(test))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: abort takes no arguments and never returns.
    unsafe { libc::abort() }
}

/// The personality routine the precompiled `core` names in its unwind tables. Nothing unwinds
/// here (`panic = "abort"`), so it is never called; without a definition the loader refuses the
/// shim ("undefined symbol: rust_eh_personality"), as every program it is preloaded into would
/// then fail to start. Defining it is the stable way to build a `no_std` shared object.
#[cfg(not(test))]
#[no_mangle]
extern "C" fn rust_eh_personality() {}
