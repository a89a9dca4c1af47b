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

mod loaded;

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

/// The socket, connected now if this is the first datagram.
unsafe fn socket() -> c_int {
    let sock = SOCK.load(Ordering::Relaxed);
    if sock != UNCONNECTED {
        return sock;
    }
    // SAFETY: no preconditions.
    let fresh = unsafe { connect_socket() };
    match SOCK.compare_exchange(UNCONNECTED, fresh, Ordering::AcqRel, Ordering::Relaxed) {
        Ok(_) => fresh,
        Err(other) => {
            // Another thread connected first.
            if fresh >= 0 {
                // SAFETY: closing the fd we just opened.
                unsafe { real!(close: unsafe extern "C" fn(c_int) -> c_int)(fresh) };
            }
            other
        }
    }
}

unsafe fn cstr<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        &[]
    } else {
        // SAFETY: callers pass C strings that libc just accepted.
        unsafe { CStr::from_ptr(p) }.to_bytes()
    }
}

fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_REALTIME is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

unsafe fn connect_socket() -> c_int {
    let len = SOCK_NAME_LEN.load(Ordering::Relaxed);
    if len == 0 {
        return -1;
    }
    // SAFETY: plain socket calls on a zeroed sockaddr_un we fill within bounds.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return -1;
        }
        let mut addr: libc::sockaddr_un = core::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // Abstract namespace: sun_path[0] stays NUL.
        let name = &*ptr::addr_of!(SOCK_NAME);
        for (dst, src) in addr.sun_path[1..].iter_mut().zip(&name[..len.min(106)]) {
            *dst = *src as c_char;
        }
        let addr_len = (core::mem::size_of::<libc::sa_family_t>() + 1 + len) as libc::socklen_t;
        if libc::connect(fd, ptr::addr_of!(addr).cast(), addr_len) != 0 {
            real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
            return -1;
        }
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, SOCK_FD_MIN);
        if high >= 0 {
            real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
            high
        } else {
            fd
        }
    }
}

/// Reports one event: into the ring if this process mapped it, else as a datagram. Waits while
/// roar's ring or queue is full: events are never dropped by the shim while roar is alive.
unsafe fn send(kind: Kind, arg: i64, fd: c_int, stat: WireStat, parts: [&[u8]; 4]) {
    let pid = event_pid();
    let mut h = Header {
        kind: kind as u16,
        pid,
        arg,
        fd,
        ts_ns: now_ns(),
        stat,
        ..Header::default()
    };
    for (i, p) in parts.iter().enumerate() {
        h.lens[i] = p.len() as u32;
    }
    if ROAR_GONE.load(Ordering::Relaxed) {
        // SAFETY: no preconditions.
        unsafe { late(&h, parts) };
        return;
    }
    // SAFETY: the mapping is never unmapped while RING_MAP points at it.
    if let Some(ring) = unsafe { ring() } {
        let [a, b, c, d] = parts;
        if ring.write(
            pid,
            &[h.as_bytes(), a, b, c, d],
            &mut RingWait::new(&ring).f(),
        ) {
            if ring.wake_needed(false) {
                wake(&ring);
            }
            return;
        }
    }
    let mut iov = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; 6];
    iov[0] = libc::iovec {
        iov_base: h.as_bytes().as_ptr() as *mut c_void,
        iov_len: h.as_bytes().len(),
    };
    for (i, p) in parts.iter().enumerate() {
        iov[i + 1] = libc::iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        };
    }
    iov[5] = libc::iovec {
        // SAFETY: KEY is written once by the constructor, before any event is sent.
        iov_base: ptr::addr_of!(KEY) as *mut c_void,
        iov_len: KEY_LEN,
    };
    // SAFETY: msghdr zeroed then pointed at our iovecs, which outlive the call.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    for _attempt in 0..2 {
        // SAFETY: no preconditions.
        let sock = unsafe { socket() };
        if sock < 0 {
            break;
        }
        loop {
            // SAFETY: msg is valid; MSG_NOSIGNAL keeps a vanished roar from killing the program.
            let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return;
            }
            // SAFETY: reading errno.
            let err = unsafe { *libc::__errno_location() };
            if err == libc::EINTR {
                continue;
            }
            if err == libc::EBADF || err == libc::ENOTSOCK || err == libc::ENOTCONN {
                // Our fd was closed behind our back (raw syscall): reconnect once.
                // SAFETY: no preconditions.
                let fresh = unsafe { connect_socket() };
                SOCK.store(fresh, Ordering::Relaxed);
                break;
            }
            if err == libc::ECONNREFUSED {
                // Nobody reads the socket: roar is gone.
                break;
            }
            return;
        }
    }
    // No roar to take it: the journal's late file keeps it.
    // SAFETY: no preconditions.
    unsafe { late(&h, parts) };
}

/// Appends one event to the late file (see [`LATE`]): its length, then the event as a datagram
/// would carry it, in one `writev` on a file opened for append, so events of concurrent
/// processes never interleave. Never creates the file (roar made it, 0600, with the ring): a
/// name someone else put there is not written through.
unsafe fn late(h: &Header, parts: [&[u8]; 4]) {
    let n = LATE_LEN.load(Ordering::Relaxed);
    if n == 0 {
        return;
    }
    // SAFETY: LATE is written once by the constructor, NUL-terminated at `n`.
    unsafe {
        let path = ptr::addr_of!(LATE).cast::<c_char>();
        let fd = real!(open: unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int)(
            path,
            libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return;
        }
        let body = h.as_bytes().len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let len = (body as u32).to_le_bytes();
        let mut iov = [libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        }; 6];
        iov[0] = libc::iovec {
            iov_base: len.as_ptr() as *mut c_void,
            iov_len: 4,
        };
        iov[1] = libc::iovec {
            iov_base: h.as_bytes().as_ptr() as *mut c_void,
            iov_len: h.as_bytes().len(),
        };
        for (i, p) in parts.iter().enumerate() {
            iov[i + 2] = libc::iovec {
                iov_base: p.as_ptr() as *mut c_void,
                iov_len: p.len(),
            };
        }
        libc::writev(fd, iov.as_ptr(), iov.len() as c_int);
        real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
    }
}

/// The ring this process mapped, if any.
unsafe fn ring() -> Option<Ring> {
    let base = RING_MAP.load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: RING_MAP is set only to a live mapping of RING_MAP_LEN bytes.
    unsafe { Ring::attach(base, RING_MAP_LEN.load(Ordering::Relaxed)) }
}

/// Wakes roar's reader sleeping on the ring (roar_wire::ring says when).
fn wake(ring: &Ring) {
    // SAFETY: FUTEX_WAKE on a word of our shared mapping, which stays mapped.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            ring.wake_word(),
            libc::FUTEX_WAKE,
            1,
            ptr::null::<libc::timespec>(),
        );
    }
}

/// How a producer waits for space in a full ring: wake roar's reader if it sleeps, yield first,
/// then short sleeps, and every second or so make sure roar is still there to drain it.
struct RingWait {
    ring: Ring,
    owner: pid_t,
    waits: u32,
}

impl RingWait {
    fn new(ring: &Ring) -> RingWait {
        RingWait {
            ring: *ring,
            owner: ring.owner_pid() as pid_t,
            waits: 0,
        }
    }

    fn f(&mut self) -> impl FnMut() -> bool + '_ {
        move || {
            if self.ring.wake_needed(true) {
                wake(&self.ring);
            }
            self.waits += 1;
            if self.waits < 64 {
                // SAFETY: no preconditions.
                unsafe { libc::sched_yield() };
                return true;
            }
            if self.waits == 64 || self.waits.is_multiple_of(1024) {
                // SAFETY: a signal-0 probe of roar's pid; errno is restored by the caller's guard.
                let gone = unsafe { libc::kill(self.owner, 0) } != 0
                    && unsafe { *libc::__errno_location() } == libc::ESRCH;
                if gone {
                    ROAR_GONE.store(true, Ordering::Relaxed);
                    RING_MAP.store(ptr::null_mut(), Ordering::Release);
                    return false;
                }
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 50_000,
            };
            // SAFETY: valid timespec; an early wake-up just retries.
            unsafe { libc::nanosleep(&ts, ptr::null_mut()) };
            true
        }
    }
}

/// Maps the ring named by `ROAR_INTERNAL_RING`: a file (a run with a journal: it outlives roar),
/// or `<roar pid>/<fd>` through /proc, so a program that closed its inherited fds still reaches
/// it. Returns the mapping's length, 0 if not mapped.
unsafe fn map_ring(spec: &[u8]) -> usize {
    let mut path = [0u8; PATH_MAX];
    if spec.first() == Some(&b'/') {
        // A ring file of its own (a run with a journal), and its late file beside it.
        if spec.len() >= PATH_MAX {
            return 0;
        }
        path[..spec.len()].copy_from_slice(spec);
        // SAFETY: the constructor is the only writer, before any thread exists.
        let late = unsafe { &mut *ptr::addr_of_mut!(LATE) };
        late[..spec.len()].copy_from_slice(spec);
        late[spec.len()..spec.len() + 5].copy_from_slice(b".late");
        late[spec.len() + 5] = 0;
        LATE_LEN.store(spec.len() + 5, Ordering::Relaxed);
    } else {
        // "/proc/" + spec + "/fd/" inserted after the pid: spec is "<pid>/<fd>".
        let Some(slash) = spec.iter().position(|b| *b == b'/') else {
            return 0;
        };
        let mut len = 0;
        for part in [b"/proc/".as_slice(), &spec[..slash], b"/fd", &spec[slash..]] {
            if len + part.len() >= 64 {
                return 0;
            }
            path[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
    }
    // SAFETY: path is NUL-terminated; plain open/fstat/mmap/close on our own fd.
    unsafe {
        let fd = real!(open: unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int)(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return 0;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let size = if libc::fstat(fd, &mut st) == 0 {
            st.st_size as usize
        } else {
            0
        };
        let map = if size > 0 {
            libc::mmap(
                ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
        if map == libc::MAP_FAILED {
            return 0;
        }
        if Ring::attach(map.cast(), size).is_none() {
            libc::munmap(map, size);
            return 0;
        }
        RING_MAP_LEN.store(size, Ordering::Relaxed);
        RING_MAP.store(map.cast(), Ordering::Release);
        size
    }
}

/// The directory a relative `path` is resolved against, written into `buf` when it must be read
/// from /proc. Empty for absolute paths.
unsafe fn base<'a>(dirfd: c_int, path: &[u8], buf: &'a mut [u8; PATH_MAX]) -> &'a [u8] {
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
unsafe fn fd_path(fd: c_int, buf: &mut [u8; PATH_MAX]) -> &[u8] {
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

fn wire_stat(st: &libc::stat) -> WireStat {
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
unsafe fn seen_flags(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
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
unsafe fn after_open(dirfd: c_int, path: *const c_char, flags: c_int, fd: c_int) {
    if fd < 0 || !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return;
    }
    let p = unsafe { cstr(path) };
    let mut buf = [0u8; PATH_MAX];
    let b = unsafe { base(dirfd, p, &mut buf) };
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

unsafe fn report_path(kind: Kind, dirfd: c_int, path: *const c_char) {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    let p = unsafe { cstr(path) };
    let mut buf = [0u8; PATH_MAX];
    let b = unsafe { base(dirfd, p, &mut buf) };
    unsafe { send(kind, 0, -1, WireStat::default(), [b, p, &[], &[]]) };
}

/// This process set up an io_uring instance (src/syscall.c): its program is reported as one
/// whose files the shim cannot see, and the job is recorded incomplete.
#[no_mangle]
pub extern "C" fn roar_shim_ring_set_up() {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    let mut buf = [0u8; PATH_MAX];
    // SAFETY: readlink writes at most buf.len() - 1 bytes into buf, a live local.
    let n = unsafe {
        libc::syscall(
            libc::SYS_readlink,
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr(),
            buf.len() - 1,
        )
    };
    let exe = &buf[..n.max(0) as usize];
    let why = followable::Unfollowable::Ring as i64;
    // SAFETY: plain byte slices; send copies them.
    unsafe {
        send(
            Kind::Untraced,
            why,
            -1,
            WireStat::default(),
            [&[], exe, &[], &[]],
        )
    };
}

/// Reports an exec of a program the shim will not be loaded into (see `followable`). `search`:
/// `file` is looked up in the PATH of `envp` as execvp does.
unsafe fn check_exec(file: *const c_char, search: bool, envp: *const *const c_char) {
    if !enabled() || file.is_null() {
        return;
    }
    // The objects this image loaded go with it.
    unsafe { loaded::report() };
    let _errno = KeepErrno::new();
    // SAFETY: exec's own argument, a C string.
    let f = unsafe { CStr::from_ptr(file) }.to_bytes_with_nul();
    let mut found = [0u8; PATH_MAX];
    let path: &[u8] = if search && !f.contains(&b'/') {
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
        let b = unsafe { base(libc::AT_FDCWD, p, &mut buf) };
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

unsafe fn report_pair(kind: Kind, fd1: c_int, p1: *const c_char, fd2: c_int, p2: *const c_char) {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    let (a, b) = unsafe { (cstr(p1), cstr(p2)) };
    let mut buf1 = [0u8; PATH_MAX];
    let mut buf2 = [0u8; PATH_MAX];
    let (ba, bb) = unsafe { (base(fd1, a, &mut buf1), base(fd2, b, &mut buf2)) };
    unsafe { send(kind, 0, -1, WireStat::default(), [ba, a, bb, b]) };
}

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
const TEMP_FLAGS: c_int = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;

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
unsafe fn fopen_flags(mode: *const c_char) -> c_int {
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
unsafe fn before_fopen(path: *const c_char, mode: *const c_char) -> c_int {
    if path.is_null() || mode.is_null() || !enabled() {
        return 0;
    }
    unsafe { seen_flags(libc::AT_FDCWD, path, fopen_flags(mode)) }
}

unsafe fn after_fopen(path: *const c_char, seen: c_int, f: *mut FILE) {
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

unsafe fn report_ftruncate(fd: c_int) {
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

unsafe fn refresh_cwd() {
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

// ---- exec: keep the shim in environments that a program scrubbed -------------------------------

const ENV_SLOTS: usize = 1024;

unsafe fn starts_with(entry: *const c_char, prefix: &[u8]) -> bool {
    unsafe { cstr(entry) }.starts_with(prefix)
}

/// Returns `envp`, or a copy in `out` with roar's variables and LD_PRELOAD put back.
unsafe fn fix_env(
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

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut out = [ptr::null(); ENV_SLOTS];
    let mut preload = [0u8; 2 * PATH_MAX];
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    unsafe { check_exec(path, false, env) };
    unsafe { real!(execve: ExecveFn)(path, argv, env) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
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
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    unsafe { check_exec(file, true, env) };
    unsafe { real!(execvpe: ExecveFn)(file, argv, env) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
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
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    unsafe {
        real!(fexecve: unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int)(
            fd, argv, env,
        )
    }
}

type SpawnFn = unsafe extern "C" fn(
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
struct FileActions {
    allocated: c_int,
    used: c_int,
    actions: *const SpawnAction,
    pad: [c_int; 16],
}

#[repr(C)]
struct SpawnAction {
    tag: c_int,
    open: OpenAction,
}

#[repr(C)]
struct OpenAction {
    fd: c_int,
    path: *const c_char,
    oflag: c_int,
    mode: libc::mode_t,
}

const SPAWN_DO_OPEN: c_int = 2;
const SPAWN_DO_CHDIR: c_int = 3;
const SPAWN_DO_FCHDIR: c_int = 4;

/// Reports the opens a successful spawn's file actions made: glibc makes them in the child with
/// its own open, which no hook sees (`make`'s and Python's redirections, `cc -o` through a
/// driver). Reported by the spawning process once the child runs, with the file as it is then.
/// Opens after a `chdir` action are relative to a directory the shim never saw: not reported.
unsafe fn report_spawn_opens(actions: *const libc::posix_spawn_file_actions_t) {
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
        if unsafe { libc::stat(a.open.path, &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
        {
            continue;
        }
        let p = unsafe { cstr(a.open.path) };
        let mut buf = [0u8; PATH_MAX];
        let b = unsafe { base(libc::AT_FDCWD, p, &mut buf) };
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
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    unsafe { check_exec(path, false, env) };
    let r = unsafe { real!(posix_spawn: SpawnFn)(pid, path, actions, attr, argv, env) };
    if r == 0 {
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
    let env = unsafe { fix_env(envp, &mut out, &mut preload) };
    unsafe { check_exec(file, true, env) };
    let r = unsafe { real!(posix_spawnp: SpawnFn)(pid, file, actions, attr, argv, env) };
    if r == 0 {
        unsafe { report_spawn_opens(actions) };
        if !pid.is_null() {
            // SAFETY: posix_spawn wrote the child's pid there.
            unsafe { vouch_for(*pid) };
        }
    }
    r
}

// ---- processes and our own fd ------------------------------------------------------------------

/// A shim without the ring (this process became another user than roar's) tells roar it started
/// `child`: roar takes a datagram only from a process it can place in the run, and a child that
/// exits before roar looks can be placed only by its parent's word.
unsafe fn vouch_for(child: pid_t) {
    if enabled() && RING_LEN.load(Ordering::Relaxed) == 0 && !ROAR_GONE.load(Ordering::Relaxed) {
        let _errno = KeepErrno::new();
        // SAFETY: no preconditions.
        unsafe {
            send(
                Kind::Spawned,
                i64::from(child),
                -1,
                WireStat::default(),
                [&[]; 4],
            )
        };
    }
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> pid_t {
    let pid = unsafe { real!(fork: unsafe extern "C" fn() -> pid_t)() };
    if pid > 0 {
        // SAFETY: no preconditions.
        unsafe { vouch_for(pid) };
    }
    if pid == 0 && enabled() {
        let _errno = KeepErrno::new();
        // SAFETY: no preconditions.
        PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        // SAFETY: no preconditions.
        let ppid = unsafe { libc::getppid() };
        unsafe { send(Kind::Fork, ppid as i64, -1, WireStat::default(), [&[]; 4]) };
    }
    pid
}

/// vfork, with the child marked ([`IN_VFORK`]). It cannot be a wrapper that calls the real one:
/// the child returns through the caller's frame and then the parent returns through it again, so,
/// like libc's own, it keeps the return address in a register across the system call.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    core::arch::naked_asm!(
        "pop rdi",
        "mov eax, {nr}",
        "syscall",
        "push rdi",
        "test eax, eax",
        "jz 2f",
        // The parent, resumed once the child exec'd or exited: vouches for the child (the pid
        // kept across the call, which the push also aligns to 16 bytes).
        "mov byte ptr [rip + {flag}], 0",
        "cmp rax, -4095",
        "jae 3f",
        "push rax",
        "mov edi, eax",
        "call {vouch}",
        "pop rax",
        "ret",
        "2:",
        "mov byte ptr [rip + {flag}], 1",
        "ret",
        // Failed: errno, -1. One push keeps the stack 16-byte aligned for the call.
        "3:",
        "neg eax",
        "push rax",
        "call {errno}",
        "pop rcx",
        "mov dword ptr [rax], ecx",
        "mov eax, -1",
        "ret",
        nr = const libc::SYS_vfork,
        flag = sym IN_VFORK,
        errno = sym libc::__errno_location,
        vouch = sym vouch_for_vforked,
    )
}

/// [`vouch_for`], called from [`vfork`]'s parent path.
extern "C" fn vouch_for_vforked(child: pid_t) {
    // SAFETY: no preconditions.
    unsafe { vouch_for(child) };
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fd >= 0 && fd == SOCK.load(Ordering::Relaxed) {
        // Programs that close every fd would cut roar off; the socket is CLOEXEC anyway.
        return 0;
    }
    unsafe { real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let f = real!(close_range: unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int);
    let sock = SOCK.load(Ordering::Relaxed);
    if sock < 0 || (sock as c_uint) < first || (sock as c_uint) > last {
        return unsafe { f(first, last, flags) };
    }
    let s = sock as c_uint;
    let mut r = 0;
    if s > first {
        r = unsafe { f(first, s - 1, flags) };
    }
    if r == 0 && s < last {
        r = unsafe { f(s + 1, last, flags) };
    }
    r
}

/// Moves our socket out of the way before the program takes its fd number.
unsafe fn vacate(newfd: c_int) {
    let sock = SOCK.load(Ordering::Relaxed);
    if sock >= 0 && sock == newfd {
        let _errno = KeepErrno::new();
        // SAFETY: duplicating an fd we own.
        let moved = unsafe { libc::fcntl(sock, libc::F_DUPFD_CLOEXEC, newfd + 1) };
        SOCK.store(moved, Ordering::Relaxed);
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    unsafe { vacate(new) };
    unsafe { real!(dup2: unsafe extern "C" fn(c_int, c_int) -> c_int)(old, new) }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    unsafe { vacate(new) };
    unsafe { real!(dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int)(old, new, flags) }
}

/// Whether the pipe at `fd` has no writer and nothing left to read: it can never carry data.
fn dead_pipe(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLHUP != 0 && p.revents & libc::POLLIN == 0
}

/// Set once this process reported its exit (a hooked `exit` runs the destructor after it).
static EXITED: AtomicBool = AtomicBool::new(false);

/// Reports the process's exit, once: from the `exit` family of hooks, or from the shim's
/// destructor for a process that returns from `main` (libc's own call to `exit` passes no hook).
pub(crate) unsafe fn report_exit(status: c_int) {
    if enabled() {
        unsafe { loaded::report() };
        // A vfork child shares the flag with its parent: it reports without marking.
        if IN_VFORK.load(Ordering::Relaxed) || !EXITED.swap(true, Ordering::Relaxed) {
            unsafe { send(Kind::Exit, status as i64, -1, WireStat::default(), [&[]; 4]) };
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn exit(status: c_int) -> ! {
    unsafe { report_exit(status) };
    unsafe { real!(exit: unsafe extern "C" fn(c_int) -> !)(status) }
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    unsafe { report_exit(status) };
    unsafe { real!(_exit: unsafe extern "C" fn(c_int) -> !)(status) }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    unsafe { report_exit(status) };
    unsafe { real!(_Exit: unsafe extern "C" fn(c_int) -> !)(status) }
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
